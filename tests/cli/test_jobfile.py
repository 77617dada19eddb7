"""Job files (services/cli/jobfile.py) and `offerbus job plan`'s placement (services/cli/
jobplan.py): the example parses, each kind of bad file is refused naming the key and line,
valid specs survive a round trip, random text raises nothing but JobFileError; the plan
places by the service framework's rules over the agents' free resources and says why not;
`offerbus job run|plan` of a bad file exits 2 with the reason before reaching any cluster."""

from __future__ import annotations

import contextlib
import dataclasses
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frameworks.service import ServiceSpec
from services.cli import jobfile, jobplan
from services.cli.jobfile import Job, JobFileError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "frameworks" / "jobs" / "web.toml"
MINIMAL = 'name = "web"\nimage = "busybox"\n'


def error(text: str) -> str:
    with pytest.raises(JobFileError) as info:
        jobfile.loads(text)
    return str(info.value)


# -- the parser ---------------------------------------------------------------------------
def test_the_example_job_file_parses() -> None:
    job = jobfile.loads(EXAMPLE.read_text())
    s = job.spec
    assert (s.name, s.instances, s.cpus, s.mem, s.ports) == ("web", 2, 0.1, 32.0, [8080])
    assert job.port_names == ["http"]
    assert s.constraints == ["hostname:unique"] and s.health_http == "/hostname"
    assert s.env == {"GREETING": "hello"} and s.command[0] == "httpd"


def test_a_minimal_file_takes_the_service_frameworks_defaults() -> None:
    s = jobfile.loads(MINIMAL).spec
    assert s == ServiceSpec(name="web", image="busybox", instances=1, cpus=0.1, mem=32)


@pytest.mark.parametrize(("text", "expected"), [
    ('name = "web"\n', "image: missing"),
    ('name = "web"\nimage = ""\n', "image (line 2): must not be empty"),
    (MINIMAL + "instances = -2\n", "instances (line 3): must be >= 0, got -2"),
    (MINIMAL + 'instances = "2"\n', "instances (line 3): expected an integer, got str"),
    (MINIMAL + "instances = true\n", "instances (line 3): expected an integer, got a boolean"),
    (MINIMAL + "imagee = 1\n", "imagee (line 3): unknown key"),
    (MINIMAL + "[resources]\ncpus = -0.5\n", "resources.cpus (line 4): must be a finite"),
    (MINIMAL + "[resources]\ncpus = 0\n", "resources.cpus (line 4): must be a finite number > 0"),
    (MINIMAL + "[resources]\nmem = nan\n", "resources.mem (line 4): must be a finite"),
    (MINIMAL + "[resources]\ngpus = 1\n", "resources.gpus (line 4): unknown key"),
    (MINIMAL + "[resources]\ndisk = 10\n", "resources.disk (line 4): not supported"),
    (MINIMAL + "[update]\nmax_unavailable = 0\n", "update.max_unavailable (line 4): must be"),
    (MINIMAL + "[update]\nbatch = 2\n", "update.batch (line 4): unknown key"),
    (MINIMAL + "[health]\ngrace = 5\n", "health.grace (line 4): not supported"),
    (MINIMAL + "ports = [80, 80]\n", "ports (line 3): port 80 given twice"),
    (MINIMAL + "ports = [70000]\n", "ports (line 3): expected port numbers 1-65535"),
    (MINIMAL + "[ports]\nhttp = 0\n", "ports.http (line 4): expected a port number"),
    (MINIMAL + "[env]\nA = 1\n", "env.A (line 4): expected a string, got int"),
    (MINIMAL + 'command = ["a", 1]\n', "command (line 3): expected an array of strings"),
    ('name = "a/b"\nimage = "x"\n', "name (line 1): 'a/b': use letters"),
    (MINIMAL + '[[constraints]]\nattribute = "rack"\nop = "near"\nvalue = "a"\n',
     "constraints[0].op (line 5): 'near'"),
    (MINIMAL + '[[constraints]]\nattribute = "rack"\nop = "unique"\n',
     "constraints[0].op (line 5): unique applies to attribute \"hostname\""),
    (MINIMAL + '[[constraints]]\nattribute = "rack"\n', "constraints[0].value: missing"),
    (MINIMAL + '[health]\ncommand = "true"\nhttp = "/"\nports = 1\n',
     "health.ports (line 6): unknown key"),
    (MINIMAL + 'ports = [80]\n[health]\ncommand = "true"\nhttp = "/"\n',
     "one health check: health.command or health.http, not both"),
    (MINIMAL + '[health]\nhttp = "/"\n', "health.http checks the first published port"),
    (MINIMAL + "name = 2\n", "not valid TOML"),  # a key set twice: tomllib says where
    ("name = \n", "not valid TOML: Invalid value (at line 1, column 8)"),
])
def test_a_bad_file_is_refused_naming_the_key(text: str, expected: str) -> None:
    assert expected in error(text)


names = st.from_regex(jobfile.NAME_RE, fullmatch=True)
texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
positive = st.floats(min_value=0.001, max_value=1e6, allow_nan=False, allow_infinity=False)
ports = st.lists(st.integers(1, 65535), unique=True, max_size=3)
env_keys = texts.filter(lambda k: k != "" and "=" not in k)
attributes = st.text(string.ascii_lowercase, min_size=1, max_size=6).filter(
    lambda a: a != "hostname")
constraints = st.lists(st.one_of(st.just("hostname:unique"), st.builds(
    lambda a, v: f"{a}:{v}", attributes, texts.filter(lambda v: v.strip() != ""))),
    max_size=3)


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    port_list = draw(ports)
    health = draw(st.sampled_from(["", "cmd", "http"] if port_list else ["", "cmd"]))
    spec = ServiceSpec(
        name=draw(names), image=draw(texts.filter(lambda t: t.strip() != "")),
        instances=draw(st.integers(0, 10_000)), cpus=draw(positive), mem=draw(positive),
        command=draw(st.lists(texts, max_size=4)), constraints=draw(constraints),
        kill_grace_s=draw(st.floats(0, 600)), role=draw(texts.filter(lambda t: t.strip() != "")),
        env=draw(st.dictionaries(env_keys, texts, max_size=4)), ports=port_list,
        health_cmd=draw(texts.filter(lambda t: t.strip() != "")) if health == "cmd" else "",
        health_http=draw(texts.filter(lambda t: t.strip() != "")) if health == "http" else "",
        health_interval_s=draw(positive), health_failures=draw(st.integers(0, 100)),
        max_unavailable=draw(st.integers(1, 50)))
    named = draw(st.booleans()) and bool(port_list)
    port_names = draw(st.lists(env_keys, min_size=len(port_list), max_size=len(port_list),
                               unique=True)) if named else []
    return Job(spec, port_names)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(jobs())
def test_a_valid_job_survives_a_round_trip(job: Job) -> None:
    assert jobfile.loads(jobfile.dumps(job)) == job


toml_values = st.recursive(
    st.one_of(st.integers(-5, 70000), st.floats(), st.booleans(), texts),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(texts, inner, max_size=3)), max_leaves=8)
keys = st.sampled_from(sorted(jobfile.TOP | jobfile.RESOURCES | jobfile.HEALTH
                              | jobfile.CONSTRAINT | jobfile.UPDATE | {"disk", "x"}))


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if value != value else "inf" if value == float("inf") else \
            "-inf" if value == float("-inf") else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return jobfile._str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{jobfile._str(k)} = {_toml(v)}" for k, v in value.items()) + "}"


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(keys, toml_values, max_size=8), st.booleans())
def test_random_documents_raise_only_the_parsers_error(doc: dict[str, Any],
                                                       base: bool) -> None:
    text = (MINIMAL if base else "") + "".join(
        f"{k} = {_toml(v)}\n" for k, v in doc.items() if not (base and k in ("name", "image")))
    try:
        job = jobfile.loads(text)
    except JobFileError:
        return
    job.spec.check()  # what the parser accepts, the service framework takes


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_random_text_raises_only_the_parsers_error(text: str) -> None:
    with contextlib.suppress(JobFileError):
        jobfile.loads(text)


def test_changed_names_what_a_rolling_update_replaces() -> None:
    a = jobfile.loads(MINIMAL).spec
    assert jobfile.changed(a, dataclasses.replace(a, instances=5, max_unavailable=3)) == []
    assert jobfile.loads(MINIMAL + "[update]\nmax_unavailable = 3\n").spec.max_unavailable == 3
    assert jobfile.changed(a, dataclasses.replace(a, image="other", cpus=1.0)) == \
        ["cpus", "image"]


# -- the plan -----------------------------------------------------------------------------
def agent(aid: str, host: str, cpus: float = 1.0, mem: float = 256, *, used_cpus: float = 0,
          status: str = "AGENT_STATUS_REGISTERED", rack: str = "a",
          ports: tuple[int, int] = (31000, 31009)) -> dict[str, Any]:
    return {"agent_info": {"agent_id": aid, "hostname": host,
                           "attributes": [{"name": "rack", "text": rack}],
                           "resources": [{"name": "cpus", "scalar": cpus, "role": "*"},
                                         {"name": "mem", "scalar": mem, "role": "*"},
                                         {"name": "ports", "role": "*", "ranges": {"ranges": [
                                             {"begin": str(ports[0]), "end": str(ports[1])}]}}]},
            "status": status,
            "used_resources": [{"name": "cpus", "scalar": used_cpus, "role": "*"}]}


def job(**changes: Any) -> ServiceSpec:
    return dataclasses.replace(jobfile.loads(MINIMAL).spec, **changes)


def rows(plan: jobplan.JobPlan) -> dict[str, tuple[list[int], str]]:
    return {a.hostname: (a.new, a.why_not) for a in plan.agents}


def test_the_plan_spreads_instances_over_the_agents_with_room() -> None:
    state = {"agents": [agent("S1", "h1"), agent("S2", "h2", used_cpus=0.95),
                        agent("S3", "h3")]}
    plan = jobplan.plan_job(job(instances=4, cpus=0.25), state)
    got = rows(plan)
    assert sorted(got["h1"][0] + got["h3"][0]) == [0, 1, 2, 3]
    assert len(got["h1"][0]) == len(got["h3"][0]) == 2
    assert got["h2"][0] == [] and "no offer fits" in got["h2"][1]
    assert plan.unplaced == [] and plan.why == ""


def test_the_plan_says_why_not_under_constraints() -> None:
    state = {"agents": [agent("S1", "h1"), agent("S2", "h2", rack="b"),
                        agent("S3", "h3", status="AGENT_STATUS_UNREACHABLE")]}
    plan = jobplan.plan_job(job(instances=2, constraints=["hostname:unique", "rack:a"]), state)
    got = rows(plan)
    assert got["h1"] == ([0], "h1 already runs an instance (hostname:unique)")
    assert got["h2"] == ([], "h2: rack is 'b', not 'a'")
    assert got["h3"] == ([], "agent is unreachable: its resources are not offered")
    assert plan.unplaced == [1] and "hostname:unique" in plan.why


def test_the_plan_counts_the_jobs_live_instances_and_the_ports() -> None:
    state = {"agents": [agent("S1", "h1", ports=(31000, 31000)), agent("S2", "h2")],
             "frameworks": [{"framework_info": {"framework_id": "F1", "name": "web"}}],
             "tasks": [{"framework_id": "F1", "agent_id": "S1",
                        "task_info": {"task_id": "web-0-3"},
                        "status": {"state": "TASK_RUNNING"}},
                       {"framework_id": "F1", "agent_id": "S2",
                        "task_info": {"task_id": "web-2-1"},
                        "status": {"state": "TASK_RUNNING"}},
                       {"framework_id": "F1", "agent_id": "S2",
                        "task_info": {"task_id": "web-1-1"},
                        "status": {"state": "TASK_FAILED"}}]}
    state["agents"][0]["used_resources"].append(
        {"name": "ports", "role": "*", "ranges": {"ranges": [{"begin": "31000",
                                                               "end": "31000"}]}})
    plan = jobplan.plan_job(job(instances=2, ports=[80]), state)
    assert plan.live == 2 and plan.remove == [2]  # instance 2 is beyond the 2 wanted
    assert [(a.hostname, a.running, a.new) for a in plan.agents] == [
        ("h1", [0], []), ("h2", [], [1])]
    assert rows(plan)["h1"][1].startswith("no offer has 1 free port(s)")
    assert plan.unplaced == []


# -- the CLI on bad files -----------------------------------------------------------------
def offerbus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "--cluster",
                           "zk://127.0.0.1:1/nowhere", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_bad_job_file_exits_2_with_the_reason(tmp_path: Path, command: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(MINIMAL + "[resources]\ncpus = -1\n")
    out = offerbus("--run-dir", str(tmp_path), "job", command, str(bad))
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{bad}: resources.cpus (line 4): must be a finite number > 0, got -1.0" in \
        out.stderr
    missing = offerbus("--run-dir", str(tmp_path), "job", command, str(tmp_path / "no.toml"))
    assert missing.returncode == 2 and "cannot read it" in missing.stderr


def test_the_readmes_job_file_parses_as_the_example_does() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("**Job files.**", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    assert jobfile.loads(block) == jobfile.loads(EXAMPLE.read_text())


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ServiceSpec, dict[str, Any]]:
    n = draw(st.integers(0, 5))
    agents = [agent(f"S{i}", f"h{i}", cpus=draw(st.sampled_from([0.5, 1.0, 2.0])),
                    mem=draw(st.sampled_from([64, 256])),
                    used_cpus=draw(st.sampled_from([0.0, 0.25, 0.5])),
                    status=draw(st.sampled_from(["AGENT_STATUS_REGISTERED"] * 3
                                                + ["AGENT_STATUS_UNREACHABLE"])),
                    rack=draw(st.sampled_from("ab"))) for i in range(n)]
    spec = job(instances=draw(st.integers(0, 8)), cpus=draw(st.sampled_from([0.1, 0.3, 0.6])),
               mem=draw(st.sampled_from([16, 100])),
               constraints=draw(st.lists(st.sampled_from(["hostname:unique", "rack:a"]),
                                         unique=True)),
               ports=draw(st.sampled_from([[], [80], [80, 81]])))
    return spec, {"agents": agents}


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(clusters())
def test_the_plan_keeps_the_frameworks_rules(case: tuple[ServiceSpec, dict[str, Any]]) -> None:
    """Every instance is placed once or said unplaced with a reason; only on registered
    agents, within their free resources, under the constraints."""
    spec, state = case
    plan = jobplan.plan_job(spec, state)
    placed = [i for a in plan.agents for i in a.new]
    assert sorted(placed + plan.unplaced) == list(range(spec.instances))
    assert bool(plan.unplaced) == bool(plan.why)
    by_host = {a["agent_info"]["hostname"]: a for a in state["agents"]}
    for row in plan.agents:
        a = by_host[row.hostname]
        free_cpus = a["agent_info"]["resources"][0]["scalar"] - a["used_resources"][0]["scalar"]
        if a["status"] != "AGENT_STATUS_REGISTERED":
            assert row.new == [] and "not offered" in row.why_not
            continue
        assert len(row.new) * spec.cpus <= free_cpus + 1e-9
        assert len(row.new) * spec.mem <= a["agent_info"]["resources"][1]["scalar"]
        assert len(row.new) * len(spec.ports) <= 10  # the agent's 10 ports
        unique = "hostname:unique" in spec.constraints
        if unique:
            assert len(row.new) <= 1
        if "rack:a" in spec.constraints and row.new:
            assert a["agent_info"]["attributes"][0]["text"] == "a"
        if not row.why_not:  # room for one more instance: it would fit
            assert (len(row.new) + 1) * spec.cpus <= free_cpus + 1e-9
            assert not (unique and row.new)
