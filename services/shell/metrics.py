"""A service's Prometheus metrics through prometheus_client: one registry per service
instance (tests run several in a process), the bus counters of `services.bus.stats.Stats`
exported as typed counters with HELP, the lines every service shows (`_elected`, `_epoch`,
`_leaderships_total`, `_notices_total`), and the text for `/metrics`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.bus.stats import Stats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# HELP of the counters kept in Stats (by the bus and by shells); others get a generic line.
STATS_HELP = {
    "frames_in": "Frames received on the service's bus sockets.",
    "frames_out": "Frames sent on the service's bus sockets.",
    "frames_dropped": "Frames refused (malformed, too large, stale epoch, unexpected), by reason.",
    "frames_unsent": "Frames that could not be sent, by reason.",
    "peers_lost": "Peers declared gone after missed heartbeats.",
    "offers_undelivered": "Offers the broker could not hand to the master (recovered at once).",
    "calls_rejected": "Calls answered with an error, by error code.",
    "calls_refused": "Calls refused while not leading, by reason.",
    "peer_errors": "Errors received from peers: counted and logged, never answered.",
    "snapshots_served": "State stream snapshots served, by kind: whole, or incremental (only "
                        "what changed since the copy a subscriber holds: the copy a new "
                        "leader's standby followed).",
}

# Latency buckets (seconds) for the histograms of the offer path: 1 ms to 2 min.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0, 120.0)


class _StatsCollector(Collector):
    """`Stats` keys `name` or `name{label=value,...}` as counters `<prefix><name>_total`."""

    def __init__(self, stats: Stats, prefix: str) -> None:
        self.stats, self.prefix = stats, prefix

    def collect(self) -> Iterator[Metric]:
        families: dict[str, list[tuple[dict[str, str], int]]] = defaultdict(list)
        for key, value in self.stats.snapshot().items():
            name, _, rest = key.partition("{")
            labels = dict(p.partition("=")[::2] for p in rest.rstrip("}").split(",") if p)
            families[name].append((labels, value))
        for name in sorted(families):
            samples = families[name]
            label_names = sorted({k for labels, _ in samples for k in labels})
            help_text = STATS_HELP.get(name, f"Count of {name.replace('_', ' ')}.")
            family = CounterMetricFamily(self.prefix + name, help_text, labels=label_names)
            for labels, value in samples:
                family.add_metric([labels.get(k, "") for k in label_names], value)
            yield family


class Metrics:
    """The metrics of one service instance: `offerbus_<service>_*`."""

    def __init__(self, service: str, stats: Stats | None = None) -> None:
        self.service = service
        self.prefix = f"offerbus_{service}_"
        self.registry = CollectorRegistry(auto_describe=True)
        self.stats = stats if stats is not None else Stats()
        self.registry.register(_StatsCollector(self.stats, self.prefix))
        self.notices = self.counter("notices", "Decisions and anomalies reported by the core, "
                                    "by kind and level.", ("kind", "level"))

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(self.prefix + name, help_text, labels, registry=self.registry)

    def gauge(self, name: str, help_text: str, labels: Sequence[str] = (),
              value: Callable[[], float] | None = None) -> Gauge:
        g = Gauge(self.prefix + name, help_text, labels, registry=self.registry)
        if value is not None:
            g.set_function(value)
        return g

    def histogram(self, name: str, help_text: str, labels: Sequence[str] = (),
                  buckets: Sequence[float] = LATENCY_BUCKETS) -> Histogram:
        return Histogram(self.prefix + name, help_text, labels, buckets=buckets,
                         registry=self.registry)

    def leadership(self, elected: Callable[[], bool], epoch: Callable[[], int]) -> Counter:
        """The lines every elected service shows; returns the leaderships counter, which the
        leader lifecycle increments each time it leads."""
        self.gauge("elected", "1 while this instance leads its role, else 0.",
                   value=lambda: float(elected()))
        self.gauge("epoch", "The leader epoch this instance leads at (0 when not leading).",
                   value=lambda: float(epoch()))
        return self.counter("leaderships", "How many times this instance became the leader.")

    def counter_function(self, name: str, help_text: str, value: Callable[[], float]) -> None:
        """A counter (`<name>_total`) whose value is read at scrape time."""
        self.registry.register(_CounterFunction(self.prefix + name, help_text, value))

    def labelled_gauge(self, name: str, help_text: str, label: str,
                       values: Callable[[], dict[str, float]]) -> None:
        """A gauge with one label whose values are read at scrape time."""
        self.registry.register(_Labelled(self.prefix + name, help_text, label, values, "gauge"))

    def labelled_counter(self, name: str, help_text: str, label: str,
                         values: Callable[[], dict[str, float]]) -> None:
        """A counter (`<name>_total`) with one label whose values are read at scrape time."""
        self.registry.register(_Labelled(self.prefix + name, help_text, label, values,
                                         "counter"))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Labelled(Collector):
    def __init__(self, name: str, help_text: str, label: str,
                 values: Callable[[], dict[str, float]], kind: str) -> None:
        self.name, self.help, self.label, self.values = name, help_text, label, values
        self.kind = kind

    def collect(self) -> Iterator[Metric]:
        family: Metric
        if self.kind == "counter":
            family = CounterMetricFamily(self.name, self.help, labels=[self.label])
        else:
            family = GaugeMetricFamily(self.name, self.help, labels=[self.label])
        for key, value in sorted(self.values().items()):
            family.add_metric([key], value)
        yield family


class _CounterFunction(Collector):
    def __init__(self, name: str, help_text: str, value: Callable[[], float]) -> None:
        self.name, self.help, self.value = name, help_text, value

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.help, value=self.value())
