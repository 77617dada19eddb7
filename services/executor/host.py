"""The executor host: one process that serves the executors of many tasks of one framework on
one agent, as Mesos's default executor serves a task group. Each task keeps its own executor
(ExecutorShell: its own core, agent link, worker and waiter threads, sandbox and log), so one
task's crash, kill or failed start never touches another's; they share the process, its
reactor, zmq context and Docker client, which is what makes a task cost a few hundred KB
instead of a forked interpreter's ~10 MB.

The agent's fork server (services.agent.launcher) forks a host per framework and passes it
launch requests on a control socket, one JSON object per line: {"id", "executor_id", "argv",
"sandbox"}, answered {"id", "pid"} (this process) or {"id", "error"}. The host exits when it
has had no executor for HOST_IDLE_EXIT_S, or none is left once the control socket closed (the
fork server or the agent is gone); a launch that meets an exiting host sees the socket close
unanswered and is sent to a new host. Executors outlive the agent, as before: the host is
re-parented to init."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import signal
import socket
import time
from pathlib import Path
from typing import Any

import zmq

from services import telemetry
from services.bus.log import KV, get_logger
from services.bus.mailbox import Mailbox
from services.bus.reactor import Reactor, Timer
from services.executor.runtime import Runtime, make_runtime
from services.executor.shell import Event, ExecutorShell, parse_args

log = get_logger("executor.host")

HOST_IDLE_EXIT_S = 2.0  # no executor left for this long: the host exits
MAX_SOCKETS = 16384  # zmq sockets per host (2 per task); zmq's default is 1023
LOG_FORMAT = "%(asctime)s %(levelname)s {who} %(name)s: %(message)s"


class SandboxLog(KV):
    """One executor's log lines, into its sandbox's executor.log (as a lone executor's are).
    The logger is not registered with the logging module: it goes with its shell."""

    def __init__(self, path: Path, executor_id: str, level: int) -> None:
        self._log = logging.Logger(f"executor[{executor_id}]", level)
        handler = logging.FileHandler(path, delay=True)
        handler.setFormatter(logging.Formatter(LOG_FORMAT.format(who=f"executor[{executor_id}]")))
        self._log.addHandler(handler)

    def close(self) -> None:
        for handler in list(self._log.handlers):
            handler.close()
            self._log.removeHandler(handler)


class ExecutorHost:
    def __init__(self, control: socket.socket, *,
                 idle_exit_s: float = HOST_IDLE_EXIT_S) -> None:
        self.reactor = Reactor()
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)
        self.idle_exit_s = idle_exit_s
        self.shells: dict[str, ExecutorShell] = {}
        self.launched = 0
        self.mailbox: Mailbox[tuple[ExecutorShell, Event]] = Mailbox()
        self.reactor.add_reader(self.mailbox, self._drain)
        self.control: socket.socket | None = control
        control.setblocking(False)
        self.reactor.add_reader(control.fileno(), self._on_control)
        self._buf = b""
        self._docker: Runtime | None = None  # one client for every task of this host
        self._idle: Timer | None = None
        self._sig_r, self._sig_w = os.pipe()
        os.set_blocking(self._sig_w, False)
        self.reactor.add_reader(self._sig_r, self._on_signal_pipe)
        self.done = False

    # -- running ---------------------------------------------------------------------------
    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: os.write(self._sig_w, bytes([signum])))
        log.info("executor host serving", pid=os.getpid())
        self._arm_idle()
        self.reactor.run(until=lambda: self.done)
        self._close_control()
        self.ctx.destroy(linger=0)
        log.info("executor host exiting", launched=self.launched)
        return 0

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self.shells:
            return
        if self.control is None:
            self.done = True  # nobody can send more work and none is left
        else:
            self._idle = self.reactor.call_later(self.idle_exit_s, self._idle_expired)

    def _idle_expired(self) -> None:
        self._idle = None
        if not self.shells:
            self._close_control()  # a launch sent meanwhile meets a closed socket: retried
            self.done = True

    # -- control socket --------------------------------------------------------------------
    def _on_control(self) -> None:
        control = self.control
        if control is None:
            return
        while True:
            try:
                chunk = control.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                log.info("control socket closed: no more launches")
                self._close_control()
                self._arm_idle()
                return
            self._buf += chunk
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            self._reply(self._handle(line))

    def _handle(self, line: bytes) -> dict[str, Any]:
        try:
            req = json.loads(line)
            rid = req.get("id")
        except (ValueError, AttributeError) as exc:
            return {"id": None, "error": f"bad request: {exc}"}
        try:
            self.launch([str(a) for a in req["argv"]])
        except Exception as exc:  # a bad request fails its task, never the host
            log.error("launch failed", error=repr(exc))
            return {"id": rid, "error": repr(exc)}
        return {"id": rid, "pid": os.getpid()}

    def _reply(self, reply: dict[str, Any]) -> None:
        if self.control is None:
            return
        try:
            self.control.sendall(json.dumps(reply).encode() + b"\n")
        except (BlockingIOError, OSError) as exc:
            log.warning("could not answer the fork server", error=repr(exc))

    def _close_control(self) -> None:
        if self.control is not None:
            self.reactor.remove_reader(self.control.fileno())
            self.control.close()
            self.control = None

    # -- executors -------------------------------------------------------------------------
    def launch(self, argv: list[str]) -> ExecutorShell:
        try:
            args = parse_args(argv)
        except SystemExit as exc:
            raise ValueError(f"bad executor arguments {argv!r}") from exc
        if args.executor_id in self.shells:
            raise ValueError(f"executor {args.executor_id} is already served here")
        sandbox = Path(args.work_dir)
        sandbox.mkdir(parents=True, exist_ok=True)
        logger = SandboxLog(sandbox / "executor.log", args.executor_id,
                            logging.getLevelName(args.log_level.upper()))
        shell = ExecutorShell(args, self._runtime(args.runtime, sandbox), self.ctx, self.reactor,
                              post=self._post, on_exit=self._exited, logger=logger)
        self.shells[args.executor_id] = shell
        self.launched += 1
        self._arm_idle()
        shell.start()
        log.info("executor started", executor=args.executor_id, tasks=len(self.shells))
        return shell

    def _runtime(self, kind: str, sandbox: Path) -> Runtime:
        if kind != "docker":
            return make_runtime(kind, sandbox)  # a process runtime per task: its own children
        if self._docker is None:
            self._docker = make_runtime("docker", sandbox)
        return self._docker

    def _post(self, shell: ExecutorShell, fn: Event) -> None:
        self.mailbox.put((shell, fn))  # from any thread

    def _drain(self) -> None:
        for shell, fn in self.mailbox.drain():
            if self.shells.get(shell.args.executor_id) is shell:
                shell.event(fn)

    def _exited(self, shell: ExecutorShell) -> None:
        # Called from the shell's own event: close it once that event is done.
        self.reactor.call_later(0.0, lambda: self._forget(shell))

    def _forget(self, shell: ExecutorShell) -> None:
        if self.shells.get(shell.args.executor_id) is not shell:
            return
        del self.shells[shell.args.executor_id]
        shell.close()
        shell.log.info("executor exiting", code=shell.exit_code)
        if isinstance(shell.log, SandboxLog):
            shell.log.close()
        log.info("executor done", executor=shell.args.executor_id, code=shell.exit_code,
                 tasks=len(self.shells))
        self._arm_idle()

    def _on_signal_pipe(self) -> None:
        os.read(self._sig_r, 64)
        log.info("terminated by signal; killing every task", tasks=len(self.shells))
        self._close_control()
        for shell in list(self.shells.values()):
            shell.terminate()
        self._arm_idle()


def _raise_fd_limit() -> None:
    """Each task holds a few descriptors (agent link, its monitor, a Docker connection)."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(control_fd: int, framework_id: str, agent_id: str, log_path: Path,
          level: str | None = None) -> int:
    """The host's main, in the process the fork server forked (fds 0-2 already point at
    /dev/null and the host's files)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter(LOG_FORMAT.format(who=f"executor-host[{os.getpid()}]")))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get("OFFERBUS_LOG_LEVEL", "INFO")).upper())
    _raise_fd_limit()
    telemetry.setup("offerbus-executor", batch=False, framework_id=framework_id,
                    agent_id=agent_id)
    started = time.monotonic()
    control = socket.socket(fileno=control_fd)
    try:
        return ExecutorHost(control).run()
    finally:
        try:
            telemetry.shutdown()
        except Exception as exc:
            log.warning("trace flush failed", error=repr(exc))
        log.info("executor host ran", seconds=round(time.monotonic() - started, 1))
