"""The function-call driver: copied next to the program and run inside the sandbox as
`python -I driver.py`. It loads solution.py, calls the named function on each case's arguments
(calls.json: the arguments only, never the expected results) and writes one JSON line per case to
the original stdout: {"case": i, "value": ...} or {"case": i, "error": "..."}. The program's own
prints go to /dev/null. Nothing here decides what passed: the harness compares the values outside
the sandbox (harness.py), so whatever the program does to this process can only lose it cases.
Standard library only.
"""

import json
import os
import sys


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def main() -> None:
    results = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    sys.stdout = open(os.devnull, "w", encoding="utf-8")
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "calls.json"), encoding="utf-8") as handle:
        spec = json.load(handle)
    with open(os.path.join(here, "solution.py"), encoding="utf-8") as handle:
        source = handle.read()
    namespace = {"__name__": "solution"}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
        function = namespace.get(spec["function"])
        if not callable(function):
            raise NameError(f"no function named {spec['function']!r}")
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the program's doing
        results.write(json.dumps({"load_error": _error(exc)}) + "\n")
        results.flush()
        return
    for index, case in enumerate(spec["calls"]):
        try:
            line = json.dumps({"case": index, "value": function(*case["args"], **case.get("kwargs", {}))})
        except BaseException as exc:
            line = json.dumps({"case": index, "error": _error(exc)})
        results.write(line + "\n")
        results.flush()


if __name__ == "__main__":
    main()
