"""Scopes and token secrets (``registry.access``): the glob rules, the scope grammar, what an
identity allows and the error ``require`` raises, secrets, hashes and expiry durations."""
from __future__ import annotations

import hashlib
import re
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.access import (
    ACTIONS,
    Identity,
    glob_matches,
    hash_secret,
    looks_like_token,
    new_secret,
    parse_expiry,
    parse_scope,
    validate_owner,
)
from registry.errors import AccessDeniedError, NotAuthenticatedError, UsageError
from registry.refs import validate_name

segment = st.from_regex(r"[a-z0-9][a-z0-9_.\-]{0,7}", fullmatch=True).filter(lambda s: ".." not in s)
names = st.lists(segment, min_size=1, max_size=4).map("/".join)


# -- globs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("glob,name,expected", [
    ("team/*", "team/bert", True),
    ("team/*", "team2/x", False),        # '*' never crosses into another segment's prefix
    ("team/*", "team/a/b", False),       # nor across '/'
    ("team/*", "team", False),
    ("team/**", "team/a/b", True),
    ("team/**", "team/x", True),
    ("team/**", "team", False),          # a trailing '**' is "something inside"
    ("team/**", "team2/x", False),
    ("**", "bert", True),
    ("**", "a/b/c", True),
    ("**/bert", "bert", True),
    ("**/bert", "x/y/bert", True),
    ("**/bert", "x/bertie", False),
    ("a/**/b", "a/b", True),
    ("a/**/b", "a/x/y/b", True),
    ("a/**/b", "a/x/y/c", False),
    ("team/bert-*", "team/bert-large", True),
    ("team/bert-*", "team/roberta", False),
    ("team/*-v2", "team/bert-v2", True),
    ("*", "bert", True),
    ("*", "team/bert", False),
    ("bert", "bert", True),
    ("bert", "bertx", False),
    ("team/b.rt", "team/bert", False),   # '.' is a literal, not a regex wildcard
])
def test_glob_rules(glob, name, expected):
    assert glob_matches(glob, name) is expected


@settings(max_examples=200, deadline=None)
@given(name=names)
def test_a_name_is_its_own_glob_and_double_star_matches_everything(name):
    validate_name(name)
    assert glob_matches(name, name)
    assert glob_matches("**", name)


@settings(max_examples=200, deadline=None)
@given(prefix=segment, tail=st.lists(segment, min_size=1, max_size=4))
def test_single_star_matches_exactly_one_segment_below_the_prefix(prefix, tail):
    name = "/".join([prefix, *tail])
    assert glob_matches(f"{prefix}/*", name) is (len(tail) == 1)
    assert glob_matches(f"{prefix}/**", name)
    # another team's names never match, however they start
    assert not glob_matches(f"{prefix}/*", "/".join([prefix + "2", *tail]))
    assert not glob_matches(f"{prefix}/**", "/".join([prefix + "x", *tail]))


@settings(max_examples=200, deadline=None)
@given(glob_segs=st.lists(st.sampled_from(["*", "**", "a", "b", "a*", "*b"]), min_size=1, max_size=4),
       name=st.lists(st.sampled_from(["a", "b", "ab", "ba"]), min_size=1, max_size=5).map("/".join))
def test_globs_agree_with_a_regex_translation(glob_segs, name):
    """An independent oracle: '*' -> [^/]*, '**' -> any run of whole segments (at least one
    when trailing)."""
    parts = []
    for i, seg in enumerate(glob_segs):
        last = i == len(glob_segs) - 1
        if seg == "**":
            parts.append("[^/]+(/[^/]+)*" if last else "([^/]+/)*")
        else:
            parts.append(seg.replace("*", "[^/]*") + ("" if last else "/"))
    pattern = "".join(parts)
    assert glob_matches("/".join(glob_segs), name) is (re.fullmatch(pattern, name) is not None)


# -- the scope grammar -------------------------------------------------------------------------

def test_scopes_parse_to_a_canonical_form():
    s = parse_scope("model:team/*:push, pull,pull")
    assert (s.kind, s.glob, s.actions) == ("model", "team/*", frozenset({"pull", "push"}))
    assert s.text == "model:team/*:pull,push"
    assert parse_scope(s.text) == s
    assert parse_scope("audit:read").kind == "audit:read"
    assert parse_scope(" admin ").kind == "admin"
    all_actions = parse_scope("model:**:" + ",".join(reversed(ACTIONS)))
    assert all_actions.text == "model:**:pull,push,alias,yank,delete,attest"


@pytest.mark.parametrize("text", [
    "", "   ", "model", "model:team/*", "model::pull", "model:team/*:", "model:team/*:fly",
    "model:Team/*:pull", "model:team//x:pull", "model:te**:pull", "model:../x:pull",
    "audit", "audit:write", "admin:all", "pull", "models:team:pull", "model:team:pull;push",
])
def test_bad_scopes_are_usage_errors_naming_the_grammar(text):
    with pytest.raises(UsageError) as caught:
        parse_scope(text)
    line = caught.value.one_line()
    assert caught.value.exit_code == 2
    assert "model:<glob>:<actions>" in line and "audit:read" in line and "admin" in line, line
    assert "\n" not in line


# -- identities --------------------------------------------------------------------------------

def ident(*scopes: str) -> Identity:
    return Identity(7, "ci", tuple(parse_scope(s) for s in scopes), None)


def test_allows_model_actions_by_glob_and_action():
    who = ident("model:team/*:pull,push")
    assert who.allows("pull", "team/bert") and who.allows("push", "team/bert")
    assert not who.allows("alias", "team/bert")
    assert not who.allows("pull", "team2/x") and not who.allows("pull", "team/a/b")
    assert who.allows("pull") and who.allows("push")   # "on some model"
    assert not who.allows("yank") and not who.allows("delete")
    assert not who.allows("audit:read") and not who.allows("admin")


def test_scopes_add_up():
    who = ident("model:team/*:pull", "model:team/*:alias", "audit:read")
    assert who.allows("pull", "team/x") and who.allows("alias", "team/x")
    assert who.allows("audit:read")
    assert not who.allows("push", "team/x") and not who.allows("admin")


def test_admin_implies_every_permission():
    who = ident("admin")
    assert who.is_admin
    for action in ACTIONS:
        assert who.allows(action, "any/model/at/all") and who.allows(action)
    assert who.allows("audit:read") and who.allows("admin")
    who.require("delete", "x")


def test_audit_read_grants_nothing_on_models():
    who = ident("audit:read")
    assert who.allows("audit:read")
    assert not any(who.allows(a) for a in ACTIONS)


def test_unknown_actions_are_a_programming_error():
    with pytest.raises(ValueError):
        ident("admin").allows("fly", "x")


def test_require_names_the_missing_scope():
    who = ident("model:team/*:pull")
    who.require("pull", "team/bert")
    with pytest.raises(AccessDeniedError) as caught:
        who.require("push", "team/bert")
    err = caught.value
    assert err.exit_code == 7 and not isinstance(err, NotAuthenticatedError)
    assert err.scope == "model:team/bert:push"
    assert "token 'ci' (id 7) lacks scope model:team/bert:push" in err.one_line()
    with pytest.raises(AccessDeniedError) as caught:
        who.require("audit:read")
    assert caught.value.scope == "audit:read"
    with pytest.raises(AccessDeniedError) as caught:
        who.require("yank")
    assert caught.value.scope == "model:<glob>:yank" and "any model" in caught.value.one_line()


def test_not_authenticated_is_access_denied_with_exit_7():
    err = NotAuthenticatedError("no token given")
    assert isinstance(err, AccessDeniedError) and err.exit_code == 7 and err.scope is None


# -- secrets, owners, expiry ---------------------------------------------------------------------

def test_secrets_are_random_and_stored_as_sha256():
    a, b = new_secret(), new_secret()
    assert a != b and a.startswith("pt2r_") and looks_like_token(a)
    assert hash_secret(a) == hashlib.sha256(a.encode()).hexdigest()
    assert hash_secret(a) != hash_secret(b)
    assert not looks_like_token("pt2r_short") and not looks_like_token(a + "\n")
    assert not looks_like_token("ghp_" + a[5:])


@pytest.mark.parametrize("owner", ["ci-training", "ana@team", "svc.inference_3", "A+b"])
def test_owner_names(owner):
    assert validate_owner(owner) == owner


@pytest.mark.parametrize("owner", ["", " ci", "-x", "a b", "x" * 65, "ci\nadmin", "é"])
def test_bad_owner_names(owner):
    with pytest.raises(UsageError, match="invalid token owner"):
        validate_owner(owner)


NOW = datetime(2026, 11, 24, 8, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text,delta", [
    ("30d", timedelta(days=30)), ("12h", timedelta(hours=12)), ("90m", timedelta(minutes=90)),
    ("2w", timedelta(weeks=2)), (" 1d ", timedelta(days=1)),
])
def test_expiry_durations(text, delta):
    assert parse_expiry(text, NOW) == NOW + delta


def test_expiry_times():
    assert parse_expiry("2027-01-31T00:00:00Z", NOW) == datetime(2027, 1, 31, tzinfo=timezone.utc)
    assert parse_expiry("2027-01-31", NOW) == datetime(2027, 1, 31, tzinfo=timezone.utc)
    assert parse_expiry("2027-01-31T02:00:00+02:00", NOW) == datetime(2027, 1, 31, tzinfo=timezone.utc)


@pytest.mark.parametrize("text", ["", "30", "d", "0d", "-1d", "3x", "30 d", "1y", "tomorrow",
                                  "2026-11-23T00:00:00Z"])
def test_bad_expiry(text):
    with pytest.raises(UsageError, match="invalid expiry") as caught:
        parse_expiry(text, NOW)
    assert "30d" in caught.value.one_line()


def test_token_help_lists_every_action_a_scope_takes():
    """``token --help`` and ``token create --help`` are written from ACTIONS: none is left out
    (``attest`` was)."""
    from tests.cli_inprocess import run_in_process

    for args in (("token", "--help"), ("token", "create", "--help")):
        text = " ".join(run_in_process(*args).stdout.split())
        assert ",".join(ACTIONS) in text, args
    assert "attest" in ACTIONS
