"""``format.schema_check`` (the manifest's fast validity check) gives ``jsonschema``'s verdict,
with the manifest's strict integers, on every valid manifest we have and on thousands of
seeded mutations of them: it must never accept what ``jsonschema`` refuses (it is the only
check of a manifest it accepts), and it should refuse what ``jsonschema`` refuses."""
import copy
import json
import random
import subprocess
import sys

import pytest

from registry.format.bundle import BundleFile
from registry.format.manifest import _validator, load_schema
from registry.format.schema_check import Unsupported, compile_schema
from tests.fixtures_pt2 import ROOT

#: values a mutation puts somewhere: every JSON type, the edges of the schema's limits
ODD = [None, True, False, 0, 1, -1, 1.0, 0.5, 2**64, "", "x", "A b", "x" * 300, "sha256:" + "0" * 64, "0" * 64,
       [], [1], ["a", "a"], {}, {"k": 1}, "programs/x.pt2", "exported_program", "cpu", "float32"]


def _manifests(bundles):
    out = [json.loads(BundleFile.open(ROOT / "tests" / "data" / "format1" / "mlp.pt2b").manifest.canonical)]
    out += [json.loads(BundleFile.open(bundles[n]).manifest.canonical) for n in ("ed", "v0")]
    return out


def _paths(value, at=()):
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*at, i))


def _mutate(raw, rng):
    doc = copy.deepcopy(raw)
    for _ in range(rng.choice((1, 1, 2, 3))):
        paths = [p for p in _paths(doc) if p]
        path = rng.choice(paths)
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        what = rng.randrange(7)
        if what == 0 and isinstance(parent, dict):
            del parent[key]
        elif what == 1 and isinstance(parent, dict):
            parent[rng.choice(("extra", "x_y", "1bad", key + "_"))] = rng.choice(ODD)
        elif what == 2 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))   # a duplicate item
        elif what == 3 and isinstance(parent[key], list):
            parent[key] = parent[key][:rng.randrange(len(parent[key]) + 1)]
        elif what == 4 and isinstance(parent[key], str):
            parent[key] = parent[key] + rng.choice(("", "!", " ", "\u00e9", "x" * 200))
        elif what == 5 and isinstance(parent[key], int) and not isinstance(parent[key], bool):
            parent[key] = rng.choice((parent[key] + 1, -parent[key] - 1, float(parent[key]), bool(parent[key] % 2)))
        else:
            parent[key] = copy.deepcopy(rng.choice(ODD))
    return doc


def test_the_fast_check_agrees_with_jsonschema_on_mutated_manifests(bundles):
    fast = compile_schema(load_schema())
    strict = _validator()
    rng = random.Random(45)
    seen = {True: 0, False: 0}
    for raw in _manifests(bundles):
        assert fast(raw) and strict.is_valid(raw)
        for _ in range(1500):
            doc = _mutate(raw, rng)
            verdict = strict.is_valid(doc)
            assert fast(doc) == verdict, (verdict, json.dumps(doc)[:2000])
            seen[verdict] += 1
    assert seen[True] > 300 and seen[False] > 2000   # both verdicts exercised


def test_keywords_it_does_not_know_are_refused_at_compile_time():
    for schema in ({"patternProperties": {"a": {}}}, {"$ref": "https://example.com/s.json"},
                   {"type": "object", "dependentRequired": {"a": ["b"]}}, {"items": [{}, {}]},
                   {"$ref": "#/$defs/missing"}, {"type": "decimal"}):
        with pytest.raises(Unsupported):
            compile_schema(schema)


def test_jsonschema_is_imported_only_to_describe_a_refused_manifest():
    code = ("import json, sys\n"
            "from registry.format.manifest import validate_raw\n"
            "from registry.format.bundle import BundleFile\n"
            f"raw = json.loads(BundleFile.open({str(ROOT / 'tests/data/format1/mlp.pt2b')!r}).manifest.canonical)\n"
            "assert validate_raw(raw) == [] and 'jsonschema' not in sys.modules\n"
            "raw['format'] = 1.0\n"
            "print(json.dumps([validate_raw(raw), 'jsonschema' in sys.modules]))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    problems, imported = json.loads(done.stdout)
    assert imported and problems == ["format: 1.0 is not of type 'integer'"]
