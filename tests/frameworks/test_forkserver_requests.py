"""The framework fork server's request rules (frameworks/forkserver.py `parse_request`): what it
forks, and every other line refused with a reason, never an exception of another kind."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from frameworks import forkserver as fs

NOW = 1_000_000.0
PY, ROOT = "/venv/bin/python", "/src/offerbus"


def request(**changes: Any) -> bytes:
    doc = {"name": "framework-web", "argv": ["-m", "frameworks.service", "--cluster", "zk://x",
                                             "--spec", "/run/frameworks/web.json"],
           "env": {"PATH": "/bin", "OFFERBUS_LOG_LEVEL": "DEBUG"}, "cwd": "/home/op",
           "deadline": NOW + 5, "python": PY, "root": ROOT}
    doc.update(changes)
    return json.dumps(doc).encode()


def parse(line: bytes) -> fs.Request:
    return fs.parse_request(line, NOW, python=PY, root=ROOT)


def test_a_good_request_gives_the_framework_its_arguments_environment_and_directory() -> None:
    req = parse(request())
    assert req.name == "framework-web"
    assert req.args == ("--cluster", "zk://x", "--spec", "/run/frameworks/web.json")
    assert req.env == {"PATH": "/bin", "OFFERBUS_LOG_LEVEL": "DEBUG"}
    assert req.cwd == "/home/op"
    assert req.deadline == NOW + 5


@pytest.mark.parametrize(("line", "says"), [
    (b"not json", "not a JSON request"),
    (b"[1, 2]", "must be a JSON object"),
    (request(python="/other/python"), "this server runs"),
    (request(root="/other/checkout"), "this server runs"),
    (request(name="../../etc/cron.d/x"), "bad process name"),
    (request(name=".hidden"), "bad process name"),
    (request(name=""), "bad process name"),
    (request(name=7), "bad process name"),
    (request(argv=["-m", "services.master"]), "runs `-m frameworks.service` only"),
    (request(argv=["-c", "import os"]), "runs `-m frameworks.service` only"),
    (request(argv="-m frameworks.service"), "argv must be a list of strings"),
    (request(argv=["-m", "frameworks.service", 3]), "argv must be a list of strings"),
    (request(env={"A": 1}), "env must be an object of strings"),
    (request(env={"A=B": "c"}), "env must be an object of strings"),
    (request(env=["A"]), "env must be an object of strings"),
    (request(env={"A\u0000": "b"}), "env must be an object of strings"),
    (request(cwd="/tmp/\u0000x"), "cwd must be an absolute path"),
    (request(cwd="relative/dir"), "cwd must be an absolute path"),
    (request(deadline="soon"), "deadline must be a number"),
    (request(deadline=True), "deadline must be a number"),
    (request(deadline=NOW - 0.5), "after its deadline"),
])
def test_a_bad_request_is_refused_with_its_reason(line: bytes, says: str) -> None:
    with pytest.raises(fs.Refused) as refused:
        parse(line)
    assert says in str(refused.value)


def test_only_the_framework_module_is_served() -> None:
    assert fs.serves(["-m", "frameworks.service", "--spec", "x"])
    assert not fs.serves(["-m", "services.agent"])
    assert not fs.serves(["-m"])


@given(st.binary(max_size=400))
def test_any_bytes_are_a_request_or_refused(line: bytes) -> None:
    with contextlib.suppress(fs.Refused):
        parse(line)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12),
       st.sampled_from(["name", "argv", "env", "cwd", "deadline", "python", "root"]))
def test_any_json_in_any_field_is_a_request_or_refused(value: Any, key: str) -> None:
    with contextlib.suppress(fs.Refused):
        parse(request(**{key: value}))
