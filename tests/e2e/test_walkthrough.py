"""``docs/api-walkthrough.md`` runs as written: every ``sh`` block in order, in one bash session (so the ids
and tokens a block prints and exports are the next block's), against the services its section 0 starts (on
free ports instead of 8001/8002, in a scratch directory); each block's documented outputs must appear in
what it printed (``tests/e2e/walkthrough.py``: shape and key values). The document drifting from the product
fails this test, naming the line. The checker itself is tested on small documents first."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shared.processes import free_port
from tests.e2e.walkthrough import Block, blocks, check, conforms, lenient_json

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "api-walkthrough.md"

SMALL = """
## 1. Something

```sh
curl -s $X/healthz   # {"status":"ok"}
curl -s $X/v1/studies/1 | jq -c '{status, iterations_done, best}'
# {"status": "done", "iterations_done": 50, "best": {"index": 256, "y": 85.17}}
curl -s $X/v1/studies -d '{}' | jq -r .detail
# strategy 'x' needs k = 9 fresh answers, ... set strategy_params.k to at most 8
```
"""


def test_the_checker_reads_the_documented_outputs() -> None:
    (block,) = blocks(SMALL)
    assert block.section == "1. Something"
    assert [(e.json, e.text[:12]) for e in block.expected] == [
        (True, '{"status":"o'),
        (True, '{"status": "'),
        (False, "strategy 'x'"),
    ]
    good = (
        '{"status":"ok","database":"ok"}\n{"status":"done","iterations_done":50,"best":{"index":3,"y":1.0}}\n'
        "strategy 'x' needs k = 9 fresh answers, 9 x 1 = 9 of output epsilon per person, but the grant caps "
        "one person: set strategy_params.k to at most 8\n"
    )
    assert check(block, good) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (('"iterations_done":50', '"iterations_done":49'), "iterations_done: 49 is not 50"),
        (('"status":"done",', ""), "no key 'status'"),
        (("at most 8", "at most 7"), "does not show"),
        (('{"status":"ok","database":"ok"}', "not json"), "line 5"),
    ],
)
def test_the_checker_catches_a_drift(change: tuple[str, str], problem: str) -> None:
    (block,) = blocks(SMALL)
    printed = (
        '{"status":"ok","database":"ok"}\n{"status":"done","iterations_done":50,"best":{"index":3,"y":1.0}}\n'
        "strategy 'x' needs k = 9 fresh answers; set strategy_params.k to at most 8\n"
    ).replace(*change)
    problems = check(block, printed)
    assert problems and problem in " ".join(problems), problems


def test_lenient_json_reads_the_documents_ellipses() -> None:
    value = lenient_json('201 {"id":1, "queries": [...], "release":{"id":1,...,"lift":null,...}, "x": ...}')
    assert (
        conforms({"id": 1, "queries": [1, 2], "release": {"id": 1, "n": 4, "lift": None}, "x": 3}, value)
        == []
    )
    assert conforms({"id": 2, "queries": [], "release": {"id": 1, "lift": None}, "x": 3}, value) == [
        "id: 2 is not 1"
    ]


def _bash_session(cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", "--noprofile", "--norc"],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the services section 0 starts in the background die with the session
    )


def _run(bash: subprocess.Popen[str], cwd: Path, number: int, block: Block) -> tuple[int, str, str]:
    script = cwd / f"block-{number}.sh"
    script.write_text(block.code, encoding="utf-8")
    out, err = cwd / f"block-{number}.out", cwd / f"block-{number}.err"
    assert bash.stdin is not None and bash.stdout is not None
    bash.stdin.write(f'source {script.name} > {out.name} 2> {err.name}; echo "__block_done__ $?"\n')
    bash.stdin.flush()
    line = bash.stdout.readline()
    while line and not line.startswith("__block_done__"):
        line = bash.stdout.readline()
    assert line, f"bash ended during the block at line {block.line}"
    return int(line.split()[1]), out.read_text(encoding="utf-8"), err.read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_api_walkthrough_runs_as_written(tmp_path: Path) -> None:
    missing = [tool for tool in ("bash", "curl", "jq") if shutil.which(tool) is None]
    if (
        missing
    ):  # like the browser tests: a failure in CI (which installs them), elsewhere a skip that says so
        message = f"the walk-through runs with {', '.join(missing)}: apt-get install {' '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    curator_port, modeler_port = free_port(), free_port()
    (tmp_path / "shared").symlink_to(ROOT / "shared")  # the document's relative paths (the demo CSV)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OPENBLAS_NUM_THREADS": "1",
    }
    for key in [k for k in env if k.startswith("POBO_")]:
        del env[key]  # the document's own settings only (SQLite in its data dirs)
    found = blocks(DOC.read_text(encoding="utf-8"))
    assert len(found) >= 20 and sum(len(b.expected) for b in found) >= 25  # the parser found them
    bash = _bash_session(tmp_path, env)
    try:
        for number, block in enumerate(found):
            block.code = (
                block.code.replace("127.0.0.1:8001", f"127.0.0.1:{curator_port}")
                .replace("127.0.0.1:8002", f"127.0.0.1:{modeler_port}")
                .replace("--port 8001", f"--port {curator_port}")
                .replace("--port 8002", f"--port {modeler_port}")
            )
            status, printed, errors = _run(bash, tmp_path, number, block)
            where = f"docs/api-walkthrough.md line {block.line} ({block.section})"
            assert status == 0, (
                f"{where}: the block exited with {status}\n{printed[-2000:]}\n{errors[-2000:]}"
            )
            problems = check(block, printed)
            assert not problems, f"{where}:\n" + "\n".join(problems) + f"\n--- printed:\n{printed[-3000:]}"
    finally:
        try:
            os.killpg(bash.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        bash.wait(timeout=30)
