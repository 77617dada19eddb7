"""The framework SDK (Mesos's scheduler driver, v1 flavoured): implement a Scheduler, run it
with a SchedulerDriver; the driver's logic lives in a pure core (core.py)."""

from frameworks.sdk.core import SchedulerCore, State
from frameworks.sdk.demand import demand
from frameworks.sdk.driver import SchedulerDriver
from frameworks.sdk.scheduler import MasterInfo, Scheduler

__all__ = ["MasterInfo", "Scheduler", "SchedulerCore", "SchedulerDriver", "State", "demand"]
