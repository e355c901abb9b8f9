"""What telemetry costs on PostgreSQL (docs/telemetry.md), against a raw psycopg autocommit
INSERT measured side by side in the same run.

One-turn runs (4 records) and 5-turn runs (each turn calls a no-op read-only tool: 5 model
turn spans, 5 tool call spans) with ``TELEMETRY`` off, then on with the OpenTelemetry SDK
exporting every span to memory (a ``SimpleSpanProcessor``: the export happens in the drive,
the dearest way to run it), interleaved run by run; each figure is the median of per-pair
ratios (the run / the raw INSERT right before it).
"""

from __future__ import annotations

import argparse
import uuid

from _setup import median_ratio, median_us, payload, raw_connection, setup_django, timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=150)
    args = parser.parse_args()
    setup_django()

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import durable_agents as da
    from durable_agents import otel
    from durable_agents.database.store import site_store
    from durable_agents.engine import telemetry as hooks
    from durable_agents.providers import scripted
    from durable_agents.providers.scripted import ScriptedModel

    store = site_store()
    raw = raw_connection()
    data = payload()
    tag = uuid.uuid4().hex[:8]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = otel.enable(tracer_provider=provider)  # switched on and off below

    @da.tool(read_only=True)
    def noop(n: int) -> int:
        return n

    one = [scripted.text("done")]
    five = [scripted.calls(scripted.call("noop", {"n": i})) for i in range(5)]
    five.append(scripted.text("done"))
    agents = {
        "one-turn": da.Agent(f"bench-otel-1-{tag}", ScriptedModel(one)),
        "5 turns": da.Agent(f"bench-otel-5-{tag}", ScriptedModel(five), "", [noop]),
    }

    def raw_insert() -> float:
        return timed(
            lambda: raw.execute(
                "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
                [f"raw-{tag}", uuid.uuid4().hex, data],
            )
        )

    results: dict[tuple[str, bool], tuple[list[float], list[float]]] = {}
    for i in range(args.n):
        for name, agent in agents.items():
            for on in (False, True):
                hooks.install(observer if on else None)
                raws, runs = results.setdefault((name, on), ([], []))
                raws.append(raw_insert())
                run_id = f"bo-{tag}-{name[0]}-{int(on)}-{i}"
                runs.append(timed(lambda a=agent, r=run_id: a.run(r, "go", store=store)))
        exporter.clear()
    otel.disable()
    for name in agents:
        off_raws, off = results[(name, False)]
        on_raws, on_runs = results[(name, True)]
        off_ratio, on_ratio = median_ratio(off, off_raws), median_ratio(on_runs, on_raws)
        print(
            f"{name:9s} off {median_us(off):8.1f} us ({off_ratio:.2f}x raw)   "
            f"on {median_us(on_runs):8.1f} us ({on_ratio:.2f}x raw)"
        )
        print(f"RESULT telemetry {name} off={off_ratio:.2f} on={on_ratio:.2f}")


if __name__ == "__main__":
    main()
