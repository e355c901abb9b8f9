"""Drive one run in this process and print how it ended, as one JSON line.

    python -m tests.support.drive <agent> <run_id> [<input>]

Crash points come from the environment (DURABLE_AGENTS_CRASH_AT, DA_CRASH_INSIDE).
"""

import json
import sys
import time

import django

django.setup()

import durable_agents as da  # noqa: E402
from durable_agents.engine.agent import get_agent  # noqa: E402
from tests.support.otel import export_from_env  # noqa: E402

export_from_env()  # with DA_OTEL_FILE: this process's spans go to that file


def main() -> None:
    agent_name, run_id = sys.argv[1:3]
    text = sys.argv[3] if len(sys.argv) > 3 else None
    deadline = time.monotonic() + 30
    while True:  # a killed driver's lease must expire before this process may take over
        try:
            out = drive(agent_name, run_id, text)
        except (da.RunBusy, da.ChildPending):  # a killed driver's sub-run's lease, too
            if time.monotonic() > deadline:
                out = {"status": "busy"}
            else:
                time.sleep(0.1)
                continue
        break
    print(json.dumps(out), flush=True)


def drive(agent_name: str, run_id: str, text: str | None) -> dict:
    try:
        result = get_agent(agent_name).run(run_id, text)
        out = {"status": "finished", "answer": result.answer}
    except da.OutcomeUnknown as exc:
        out = {"status": "halted", "halts": exc.details.get("halts")}
    except da.ApprovalPending as exc:
        out = {"status": "awaiting_approval", "calls": exc.details.get("calls")}
    except (da.InterruptPending, da.SignalPending) as exc:
        out = {"status": "awaiting_input", "waits": exc.details.get("waits")}
    except (da.RunBusy, da.ChildPending):
        raise
    except da.SagaAborted as exc:
        out = {"status": "compensated", "code": exc.code, "undone": exc.details.get("undone")}
    except da.DurableAgentsError as exc:
        out = {"status": "error", "code": exc.code, "message": str(exc)}
    return out


if __name__ == "__main__":
    main()
