"""The persistent interpreter behind the python tool; runs as its own process.

Requests arrive as JSON lines on fd REQ, answers leave as JSON lines on fd RES (both passed
on the command line) so that user code printing to stdout cannot corrupt the protocol.
fd 1 and 2 point at a capture file, so output of subprocesses (os.system) is kept too.
SIGINT raises KeyboardInterrupt inside the user's code: that is how interrupts work.
"""

from __future__ import annotations

import ast
import io
import json
import os
import sys
import traceback


def run_cell(code: str, namespace: "dict[str, object]", capture_path: str) -> "dict[str, object]":
    out, err = io.StringIO(), io.StringIO()
    raw_start = os.lseek(1, 0, os.SEEK_END)
    result = None
    error = None
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            final = tree.body.pop()
            assert isinstance(final, ast.Expr)
            last = ast.Expression(final.value)
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), namespace)
            if value is not None:
                result = repr(value)
    except KeyboardInterrupt:
        error = "KeyboardInterrupt: interrupted"
    except BaseException as exc:  # SystemExit included: the interpreter must survive
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        # Drop the frames of this driver; the user wants their own.
        error = "".join(l for l in lines if "python_repl.py" not in l)
    finally:
        sys.stdout, sys.stderr = old_out, old_err
    for stream in (sys.__stdout__, sys.__stderr__):
        if stream is not None:
            try:
                stream.flush()
            except Exception:
                pass
    with open(capture_path, "rb") as fh:
        fh.seek(raw_start)
        raw = fh.read().decode("utf-8", "replace")
    return {"stdout": raw + out.getvalue(), "stderr": err.getvalue(), "result": result, "error": error}


def main() -> None:
    # Like an interactive interpreter: imports resolve from the working directory, never
    # from this driver's own directory (whose modules would shadow the user's).
    sys.path[0] = ""
    req_fd, res_fd, capture_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    requests = os.fdopen(req_fd, "r", encoding="utf-8")
    responses = os.fdopen(res_fd, "w", encoding="utf-8")
    namespace: "dict[str, object]" = {"__name__": "__main__"}
    while True:
        try:
            line = requests.readline()
        except KeyboardInterrupt:  # an interrupt that arrived between cells
            continue
        if not line:
            return
        try:
            answer = run_cell(json.loads(line)["code"], namespace, capture_path)
        except KeyboardInterrupt:
            answer = {"stdout": "", "stderr": "", "result": None, "error": "KeyboardInterrupt"}
        responses.write(json.dumps(answer) + "\n")
        responses.flush()


if __name__ == "__main__":
    main()
