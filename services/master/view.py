"""The master's /state and its core-derived metrics, off the reactor (issue 8): a replica of
what the master publishes on its state stream, kept for the HTTP threads. The reactor only
hands over: the entries of each publish (coalesced by key, so the handover is bounded by the
state's size however rarely anyone scrapes) and a few facts not on the stream (master id,
epoch, paused, cluster id); it does nothing per scrape. A scrape takes what was handed over
since the last one on its own thread, in two tiers: the tally (each key's latest entry and
the counts /metrics shows: all a /metrics scrape needs) and the replica (records by id in
order, what /state shows: brought up to the tally only when a document is asked for; each
record's JSON is made once, when a document first shows it). The document of one version
(and one query) is built once: the same version, the same bytes, and the same ETag.

Task environments are never shown (issue 11): every CommandInfo's `env` keeps its names, each
value replaced by REDACTED (services/shell/http.py), in /state, /state/events and whatever
reads them (the CLI)."""

from __future__ import annotations

import bisect
import itertools
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, NamedTuple

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from schemas import bus_pb2, common_pb2, state_pb2
from services.shell.http import redacted

StateEntry = bus_pb2.StateEntry
Query = dict[str, list[str]]
SHOWN = ("agent", "framework", "task", "role", "job")  # the stream's kinds /state lists
QUERY_KEYS = ("framework", "framework_name", "tasks", "agents", "decisions")
YIELD_EVERY = 100  # entries applied between two offers of the GIL to the reactor
PENDING_SLACK = 10_000  # entries waiting beyond the state's size before it is taken whole
MAX_CACHED_DOCUMENTS = 8  # documents kept for the current version (one per query)
# A query: (framework ids, framework names, with tasks, with agents, with decisions).
_Key = tuple[tuple[str, ...], tuple[str, ...], bool, bool, bool]


class BadQuery(ValueError):
    """A /state query this view does not understand (answered 400)."""


def _shown(record: Any) -> dict[str, Any]:
    shown: dict[str, Any] = redacted(MessageToDict(record, preserving_proto_field_name=True))
    return shown


def _fragment(record: Any) -> bytes:
    """One record as /state shows it (environments redacted)."""
    return json.dumps(_shown(record), sort_keys=True).encode()


def _assemble(parts: dict[str, Any]) -> bytes:
    """`parts` as a JSON object with sorted keys (as json.dumps(sort_keys=True) writes it);
    a value given as list[bytes] is a list of ready-made JSON fragments."""
    out = [b"{"]
    for i, key in enumerate(sorted(parts)):
        value = parts[key]
        out.append(b"%s%s: " % (b", " if i else b"", json.dumps(key).encode()))
        if isinstance(value, list) and all(isinstance(v, bytes) for v in value):
            out.extend((b"[", b", ".join(value), b"]"))
        else:
            out.append(json.dumps(value, sort_keys=True).encode())
    out.append(b"}")
    return b"".join(out)


def reference_document(meta: dict[str, Any] | None, entries: Iterable[StateEntry]) -> bytes:
    """/state built in one go from the whole state (what the master did on its reactor
    before issue 8): kept as the reference the view is tested and benchmarked against."""
    if meta is None:
        return b""
    state: dict[str, Any] = {**meta, "agents": [], "frameworks": [], "tasks": [], "roles": [],
                             "jobs": []}
    for entry in entries:
        kind = entry.value.WhichOneof("kind")
        if kind in SHOWN:
            record = getattr(entry.value, kind)
            state[f"{kind}s"].append(_shown(record))
    return json.dumps(state, sort_keys=True).encode()


class _Table:
    """Records by id, in id order, each with one label (a status, a name) for counts and
    filters, and as its JSON fragment once a document needed it (made then, once: a scrape
    of /metrics after a failover's 100,000 new records makes none)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[bytes | Message, str]] = {}
        self._order: list[str] = []  # sorted ids, but for those in _new
        self._new: list[str] = []  # ids added since the order was last asked for

    def put(self, key: str, record: Message, label: str) -> str | None:
        """Store; returns the label it replaced (None: a new row)."""
        old = self.rows.get(key)
        if old is None:
            self._new.append(key)
        self.rows[key] = (record, label)
        return old[1] if old is not None else None

    @property
    def order(self) -> list[str]:
        """The ids in order. New ones are merged in when asked for, in one sort (a sorted
        run and a new one: linear), not one insort each: 100,000 new tasks after a failover
        made 100,000 memmoves of the whole list."""
        if self._new:
            self._order += self._new
            self._order.sort()
            self._new = []
        return self._order

    def fragment(self, key: str) -> bytes:
        shown, label = self.rows[key]
        if not isinstance(shown, bytes):
            shown = _fragment(shown)
            self.rows[key] = (shown, label)
        return shown

    def pop(self, key: str) -> str | None:
        old = self.rows.pop(key, None)
        if old is None:
            return None
        order = self.order
        del order[bisect.bisect_left(order, key)]
        return old[1]

    def fragments(self) -> Iterator[bytes]:
        return (self.fragment(k) for k in self.order)

    def __len__(self) -> int:
        return len(self.rows)


class _Spot(NamedTuple):
    """Where a stream key's record lives in the replica (a tuple: one is made per entry)."""

    kind: str
    framework_id: str
    key: str


def _names(enum: Any) -> dict[int, str]:
    return {v.number: v.name for v in enum.DESCRIPTOR.values}


# Labels by number, read once per entry (EnumTypeWrapper.Name is Python, and slower).
_TASK_STATES = _names(common_pb2.TaskState)
_AGENT_STATUSES = _names(state_pb2.AgentRecord.Status)
_KINDS = frozenset((*SHOWN, "decision"))  # what the replica keeps
_FRAMEWORK = ("framework", 0)  # a framework's tally key (tasks and agents: their state)
_UNCOUNTED = ("", 0)  # the tally key of what /metrics does not count


def _counted(entry: StateEntry) -> tuple[str, int]:
    """An entry's key in the tally."""
    value = entry.value
    kind = value.WhichOneof("kind")
    if kind == "task":
        return "task", value.task.status.state
    if kind == "agent":
        return "agent", value.agent.status
    return _FRAMEWORK if kind == "framework" else _UNCOUNTED


class StateView:
    """Fed by the reactor (`lead`, `publish`, `set_meta`, `step_down`: cheap, and nothing per
    scrape), read by the HTTP threads (`document`, `counts`). It shows what was published:
    an agent's last_seen_us as of its last change on the stream (liveness reports refresh
    the core's copy without publishing), as every subscriber of the stream sees it."""

    def __init__(self, master_id: str,
                 current: Callable[[], Collection[StateEntry]] = tuple) -> None:
        """`current`: the whole published state (read on the reactor), taken instead of the
        entries waiting when those outnumber it (deletions of keys long gone, unscraped)."""
        self.master_id = master_id
        self._current = current
        # -- the handover (reactor -> HTTP threads), under _handover
        self._handover = threading.Lock()
        self._changed = threading.Condition(self._handover)  # a handover happened
        self._pending: dict[str, StateEntry] = {}  # coalesced by key
        # Publishes handed over as they came, coalesced into _pending (on the reactor) only
        # past twice the state's size plus PENDING_SLACK entries, else by the HTTP thread.
        self._batches: list[list[StateEntry]] = []
        self._batched = 0
        self._base: list[StateEntry] | None = None  # a whole new state (a new reign)
        self._meta: dict[str, Any] | None = None  # None: not leading
        self._handed = 0  # bumped by every handover
        # -- the tally (HTTP threads), under _build: taken from each handover, the latest
        # entry of every key the replica keeps and the counts /metrics shows, without the
        # replica (a /metrics scrape after a failover's 110,000 new entries: ~0.14 s, not
        # the replica's ~0.9 s of GIL taken from the reactor's re-registrations)
        self._build = threading.Lock()
        self._applied = -1
        self._latest: dict[str, StateEntry] = {}  # of the _KINDS, by stream key
        self._tally: Counter[tuple[str, int]] = Counter()  # (kind, status) of _COUNTED
        self._counted_meta: dict[str, Any] | None = None
        self._waiting_base: list[StateEntry] | None = None  # for the replica, taken
        self._waiting: dict[str, StateEntry] = {}  # for the replica, taken (by key)
        # -- the replica (HTTP threads), under _build: what documents show
        self._version = 0  # bumped when what /state shows changed
        self._shown_meta: dict[str, Any] | None = None
        self.agents, self.frameworks, self.roles = _Table(), _Table(), _Table()
        self.decisions = _Table()  # the allocator's latest, by framework (?decisions=1)
        self.jobs = _Table()  # submitted jobs, by name
        self.tasks: dict[str, _Table] = {}  # framework id -> its tasks
        self._task_frameworks: list[str] = []  # sorted keys of self.tasks
        self._spots: dict[str, _Spot] = {}
        self.task_counts: Counter[str] = Counter()  # by state
        self.agent_counts: Counter[str] = Counter()  # by status
        self._docs: dict[tuple[Any, ...], bytes] = {}  # this version's documents, by query
        self._docs_version = -1
        self._etag_prefix = uuid.uuid4().hex[:8]  # ETags of another process never match

    # -- the reactor's side: cheap, never per scrape -------------------------------------
    def lead(self, entries: list[StateEntry], **meta: Any) -> None:
        """A new reign holding `entries` (the list is kept, not copied: not to be changed)."""
        with self._handover:
            self._base, self._pending, self._batches, self._batched = entries, {}, [], 0
            self._meta = {"master_id": self.master_id, **meta}
            self._handed += 1
            self._changed.notify_all()

    def publish(self, entries: Iterable[StateEntry]) -> None:
        """Entries just published on the state stream."""
        batch = entries if isinstance(entries, list) else list(entries)
        with self._handover:
            self._batches.append(batch)
            self._batched += len(batch)
            self._handed += 1
            self._changed.notify_all()
            if self._batched <= PENDING_SLACK + 2 * len(self._current()):
                return  # bounded by the state's size: what the HTTP thread coalesces
            pending = _coalesce(self._pending, self._batches)
            self._batches, self._batched = [], 0
            if len(pending) > PENDING_SLACK:
                whole = self._current()
                if len(pending) > len(whole) + PENDING_SLACK:
                    self._base, self._pending = list(whole), {}

    def set_meta(self, **changes: Any) -> None:
        with self._handover:
            if self._meta is not None:
                self._meta = {**self._meta, **changes}
                self._handed += 1
                self._changed.notify_all()

    def step_down(self) -> None:
        with self._handover:
            self._base, self._pending, self._meta = [], {}, None
            self._batches, self._batched = [], 0
            self._handed += 1
            self._changed.notify_all()

    def wait_handover(self, seen: int, timeout: float) -> int:
        """On an HTTP thread: block until a handover after the one numbered `seen` (or
        `timeout` seconds); the latest handover's number."""
        with self._changed:
            self._changed.wait_for(lambda: self._handed != seen, timeout)
            return self._handed

    def meta(self) -> dict[str, Any] | None:
        with self._handover:
            return self._meta

    # -- the HTTP threads' side ----------------------------------------------------------
    def document(self, query: Query) -> tuple[int, bytes, str]:
        """(HTTP status, body, ETag) of /state for `query`; BadQuery when not understood."""
        key = _query_key(query)  # BadQuery before any work
        with self._build:
            self._sync()
            if self._shown_meta is None:
                return 503, json.dumps({"leading": False, "id": self.master_id}).encode(), ""
            etag = f'"{self._etag_prefix}-{self._version}-{hash(key) & 0xffffffff:x}"'
            if self._docs_version != self._version:
                self._docs, self._docs_version = {}, self._version
            body = self._docs.get(key)
            if body is None:
                if len(self._docs) >= MAX_CACHED_DOCUMENTS:
                    self._docs.clear()
                body = self._docs[key] = self._render(key)
            return 200, body, etag

    def counts(self) -> tuple[dict[str, int], dict[str, int], int]:
        """(tasks by state, agents by status, frameworks) for /metrics: from the tally,
        never the replica."""
        with self._build:
            self._take()
            if self._counted_meta is None:
                return {}, {}, 0
            tasks: dict[str, int] = {}
            agents: dict[str, int] = {}
            for (kind, number), n in self._tally.items():
                if n and kind == "task":  # a number of a newer schema: as a number
                    tasks[_TASK_STATES.get(number, str(number))] = n
                elif n and kind == "agent":
                    agents[_AGENT_STATUSES.get(number, str(number))] = n
            return tasks, agents, self._tally[_FRAMEWORK]

    def _take(self) -> None:
        """What the reactor handed over since the last take: into the tally, and waiting
        (coalesced by key) for the replica. Under _build."""
        with self._handover:
            if self._handed == self._applied:
                return
            base, pending, meta = self._base, self._pending, self._meta
            batches = self._batches
            self._base, self._pending, self._applied = None, {}, self._handed
            self._batches, self._batched = [], 0
        self._counted_meta = meta
        if base is not None:  # a whole state (no deletions), counted in bulk
            self._latest = {e.key: e for e in base
                            if not e.deleted and e.value.WhichOneof("kind") in _KINDS}
            self._tally = Counter(map(_counted, self._latest.values()))
            self._waiting_base, self._waiting = base, {}
        for group in (pending.values(), *batches):
            self._count(group, self._waiting)
        if len(self._waiting) > len(self._latest) + PENDING_SLACK:
            # Changes the replica was not asked for, outnumbering the state (deletions of
            # keys long gone): the replica will take the state whole instead.
            self._waiting_base, self._waiting = list(self._latest.values()), {}

    def _count(self, entries: Iterable[StateEntry], waiting: dict[str, StateEntry]) -> None:
        latest, tally = self._latest, self._tally
        for i, entry in enumerate(entries, 1):
            key = entry.key
            waiting[key] = entry
            old = latest.get(key)
            if old is not None:
                tally[_counted(old)] -= 1
            kind = None if entry.deleted else entry.value.WhichOneof("kind")
            if kind in _KINDS:
                latest[key] = entry
                tally[_counted(entry)] += 1
            elif old is not None:
                del latest[key]
            if i % YIELD_EVERY == 0:
                time.sleep(0)  # let the reactor have the GIL now, not at the next switch

    def _sync(self) -> None:
        """The replica brought up to what the tally took."""
        self._take()
        base, pending, meta = self._waiting_base, self._waiting, self._counted_meta
        if base is None and not pending and meta == self._shown_meta:
            return
        self._waiting_base, self._waiting = None, {}
        changed = meta != self._shown_meta
        self._shown_meta = meta
        if base is not None:
            self._clear()
            changed = True
            base = sorted(base, key=_by_key)  # ids in order: each row is appended
        for i, entry in enumerate(itertools.chain(base or (), pending.values()), 1):
            changed = self._apply(entry) or changed
            if i % YIELD_EVERY == 0:
                time.sleep(0)  # let the reactor have the GIL now, not at the next switch
        if changed:
            self._version += 1

    def _clear(self) -> None:
        self.agents, self.frameworks, self.roles = _Table(), _Table(), _Table()
        self.decisions, self.jobs = _Table(), _Table()
        self.tasks, self._task_frameworks, self._spots = {}, [], {}
        self.task_counts, self.agent_counts = Counter(), Counter()

    def _apply(self, entry: StateEntry) -> bool:
        """One stream entry into the replica; False when /state does not show it."""
        kind = entry.value.WhichOneof("kind") if not entry.deleted else None
        if entry.deleted or kind not in _KINDS:
            spot = self._spots.pop(entry.key, None)
            if spot is not None:
                self._remove(spot)
            return spot is not None
        record = getattr(entry.value, kind)  # its JSON is made when a document shows it
        if kind == "agent":
            spot = _Spot("agent", "", record.agent_info.agent_id)
            label = _AGENT_STATUSES.get(record.status) or \
                state_pb2.AgentRecord.Status.Name(record.status)
            _recount(self.agent_counts, self.agents.put(spot.key, record, label), label)
        elif kind == "framework":
            spot = _Spot("framework", "", record.framework_info.framework_id)
            self.frameworks.put(spot.key, record, record.framework_info.name)
        elif kind == "role":
            spot = _Spot("role", "", entry.key)
            self.roles.put(spot.key, record, "")
        elif kind == "decision":
            spot = _Spot("decision", "", record.framework_id)
            self.decisions.put(spot.key, record, "")
        elif kind == "job":
            spot = _Spot("job", "", record.name)
            self.jobs.put(spot.key, record, "")
        else:
            spot = _Spot("task", record.framework_id, record.task_info.task_id)
            state = record.status.state
            label = _TASK_STATES.get(state) or common_pb2.TaskState.Name(state)
            table = self.tasks.get(spot.framework_id)
            if table is None:
                table = self.tasks[spot.framework_id] = _Table()
                bisect.insort(self._task_frameworks, spot.framework_id)
            _recount(self.task_counts, table.put(spot.key, record, label), label)
        old = self._spots.get(entry.key)
        if old is not None and old != spot:  # the same key, another record id: unlikely
            self._remove(old)
        self._spots[entry.key] = spot
        return True

    def _remove(self, spot: _Spot) -> None:
        if spot.kind == "agent":
            _recount(self.agent_counts, self.agents.pop(spot.key), None)
        elif spot.kind == "framework":
            self.frameworks.pop(spot.key)
        elif spot.kind == "role":
            self.roles.pop(spot.key)
        elif spot.kind == "decision":
            self.decisions.pop(spot.key)
        elif spot.kind == "job":
            self.jobs.pop(spot.key)
        else:
            table = self.tasks.get(spot.framework_id)
            if table is None:
                return
            _recount(self.task_counts, table.pop(spot.key), None)
            if not table:
                del self.tasks[spot.framework_id]
                fids = self._task_frameworks
                del fids[bisect.bisect_left(fids, spot.framework_id)]

    def _render(self, key: _Key) -> bytes:
        assert self._shown_meta is not None
        ids, names, with_tasks, with_agents, with_decisions = key
        parts: dict[str, Any] = dict(self._shown_meta)
        if with_agents:
            parts["agents"] = list(self.agents.fragments())
        parts["roles"] = list(self.roles.fragments())
        parts["jobs"] = list(self.jobs.fragments())
        if not ids and not names:
            fids = self._task_frameworks
            parts["frameworks"] = list(self.frameworks.fragments())
            counts: dict[str, int] = dict(self.task_counts)
            chosen: set[str] | None = None  # every framework
        else:
            rows = self.frameworks.rows
            chosen = {f for f in ids if f in rows}
            chosen |= {f for f, (_, name) in rows.items() if name in names}
            fids = [f for f in self._task_frameworks if f in chosen]
            parts["filter"] = {"framework": list(ids), "framework_name": list(names)}
            parts["frameworks"] = [self.frameworks.fragment(f) for f in sorted(chosen)]
            counts = Counter(label for f in fids
                             for _, label in self.tasks[f].rows.values())
        parts["task_counts"] = dict(sorted(counts.items()))
        if with_decisions:
            parts["decisions"] = [self.decisions.fragment(f) for f in self.decisions.order
                                  if chosen is None or f in chosen]
        if with_tasks:
            parts["tasks"] = [frag for f in fids for frag in self.tasks[f].fragments()]
        return _assemble(parts)


def _coalesce(pending: dict[str, StateEntry],
              batches: list[list[StateEntry]]) -> dict[str, StateEntry]:
    """`pending` with the entries of `batches` (in order: the last of a key wins)."""
    for batch in batches:
        for entry in batch:
            pending[entry.key] = entry
    return pending


def _by_key(entry: StateEntry) -> str:
    return entry.key


def _recount(counts: Counter[str], old: str | None, new: str | None) -> None:
    if old is not None:
        counts[old] -= 1
        if not counts[old]:
            del counts[old]
    if new is not None:
        counts[new] += 1


def _query_key(query: Query) -> _Key:
    """(framework ids, framework names, with tasks, with agents) of a /state query."""
    unknown = sorted(set(query) - set(QUERY_KEYS))
    if unknown:
        raise BadQuery(f"unknown /state parameter(s) {', '.join(unknown)}; known: "
                       f"{', '.join(QUERY_KEYS)} (framework=ID and framework_name=NAME "
                       f"repeatable; tasks=0 and agents=0 leave those lists out; "
                       f"decisions=1 adds the allocator's latest decision per framework)")
    lists = {}
    for name, default in (("tasks", "1"), ("agents", "1"), ("decisions", "0")):
        value = query.get(name, [default])[-1]
        if value not in ("0", "1"):
            raise BadQuery(f"{name}={value!r}: use {name}=0 (no {name} list) or {name}=1")
        lists[name] = value == "1"
    return (tuple(sorted(set(query.get("framework", [])))),
            tuple(sorted(set(query.get("framework_name", [])))), lists["tasks"],
            lists["agents"], lists["decisions"])
