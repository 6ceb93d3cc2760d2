"""A stand-in for DNS in a test's ``pt2reg serve`` (on its PYTHONPATH, Python imports this at
start): ``$PT2REG_TEST_FAKE_DNS`` names a JSON file ``{"name": [answer, ...]}``, an answer an
address or a list of them. Each lookup of a listed name gets the next answer (the last one from then on), counting
afresh whenever the file changes; every other name (and every address) resolves as usual.
So a test makes a name resolve to a public address when a webhook is added and to 127.0.0.1
when it is delivered (DNS rebinding), without a DNS server."""
import json
import os
import socket
import threading

_PATH = os.environ.get("PT2REG_TEST_FAKE_DNS")

if _PATH:
    _real = socket.getaddrinfo
    _lock = threading.Lock()
    _state: dict = {"text": None, "calls": {}}

    def _fake_getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002 - socket's names
        name = host.decode() if isinstance(host, bytes) else host
        try:
            with open(_PATH, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            text = "{}"
        with _lock:
            if text != _state["text"]:
                _state.update(text=text, calls={})
            answers = json.loads(text or "{}").get(str(name).lower().rstrip(".")) if name else None
            if answers is None:
                return _real(host, port, family, type, proto, flags)
            i = _state["calls"].get(name, 0)
            _state["calls"][name] = i + 1
        answer = answers[min(i, len(answers) - 1)]
        out = []
        for address in [answer] if isinstance(answer, str) else answer:
            v6 = ":" in address
            sockaddr = (address, int(port or 0), 0, 0) if v6 else (address, int(port or 0))
            out.append((socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                        sockaddr))
        return out

    socket.getaddrinfo = _fake_getaddrinfo
