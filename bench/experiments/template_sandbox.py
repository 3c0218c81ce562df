"""Request chat templates that loop forever, several at once, against the template sandbox's budget
(preprocessor/template_sandbox.py, `--trust-request-chat-template`): when is each one answered, counted from its
submission, and how soon does a good template render right after?

Each round submits --loopers looping templates at once to a full pool of --workers workers (budget --timeout s),
then, as soon as all are answered, one good template. Printed per spare count: the loopers' answer times (min / median /
max), the worst one over the budget, and the good template's latency; side by side, with the budget + 0.5 s
target (printed, not asserted: timings are figures). --hog N runs N busy-looping processes meanwhile (a loaded
machine: worker start-up is slowest then).

    python -m bench.experiments.template_sandbox [--loopers 6] [--workers 2] [--timeout 2] [--spares 0,1] [--rounds 3]
                                                 [--hog 0] [--quick]
"""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time

from bench.common import bench_parser
from preprocessor.template import RenderJob
from preprocessor.template_sandbox import TemplateSandbox
from splice.errors import SpliceError

LOOPER = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}x"
GOOD = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def _job(template: str) -> RenderJob:
    messages = [{"role": "user", "content": "hi"}]
    return RenderJob(template, {"string": messages, "openai": messages}, True, {})


def _timed(sandbox: TemplateSandbox, template: str) -> tuple[float, str]:
    began = time.monotonic()
    try:
        sandbox.render(_job(template))
        code = "OK"
    except SpliceError as exc:
        code = exc.code
    return time.monotonic() - began, code


def _round(sandbox: TemplateSandbox, loopers: int) -> tuple[list[float], list[str], float, str]:
    results: list[tuple[float, str]] = []
    lock = threading.Lock()
    together = threading.Barrier(loopers)

    def one() -> None:
        together.wait()  # submitted at once, however slowly the threads start
        got = _timed(sandbox, LOOPER)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=one) for _ in range(loopers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    good_s, good_code = _timed(sandbox, GOOD)
    return [s for s, _ in results], [c for _, c in results], good_s, good_code


def _hog(stop) -> None:
    while not stop.is_set():
        pass


def main() -> None:
    parser = bench_parser(__doc__, quick={"loopers": 2, "timeout": 0.5, "rounds": 1}, model=None, repeats=None,
                          loopers=6, workers=2, timeout=2.0)
    parser.add_argument("--spares", default="0,1", help="spare counts to compare, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hog", type=int, default=0, help="busy-looping processes beside the bench")
    args = parser.parse_args()

    stop = multiprocessing.Event()
    hogs = [multiprocessing.Process(target=_hog, args=(stop,), daemon=True) for _ in range(args.hog)]
    for h in hogs:
        h.start()
    rows = []
    try:
        for spares in (int(s) for s in args.spares.split(",")):
            try:
                sandbox = TemplateSandbox(args.workers, args.timeout, spares=spares)
                label = f"{spares} spare(s)"
            except TypeError:  # a sandbox from before spares existed (to measure the old one)
                sandbox = TemplateSandbox(args.workers, args.timeout)
                label = "no spares (before)"
            try:
                if hasattr(sandbox, "wait_warm"):
                    sandbox.wait_warm(120)
                sandbox.render(_job(GOOD))  # the pool is up: what follows is the loopers' time alone
                times: list[float] = []
                codes: list[str] = []
                goods: list[float] = []
                good_codes: list[str] = []
                for _ in range(args.rounds):
                    if hasattr(sandbox, "wait_warm"):
                        sandbox.wait_warm(120)  # each round starts from a full pool
                    t, c, g, gc = _round(sandbox, args.loopers)
                    times += t
                    codes += c
                    goods.append(g)
                    good_codes.append(gc)
            finally:
                sandbox.close()
            rows.append((label, times, codes, goods, good_codes))
    finally:
        stop.set()
        for h in hogs:
            h.join()

    budget = args.timeout
    print(f"{args.loopers} looping templates at once, {args.workers} workers, budget {budget:g} s (target: each "
          f"answered within {budget + 0.5:g} s), {args.rounds} rounds, {args.hog} CPU hog(s)")
    print(f"{'pool':<20} {'looper answer s (min / median / max)':<38} {'worst - budget':>15} "
          f"{'good template after (s)':>24}  codes")
    for label, times, codes, goods, good_codes in rows:
        spread = f"{min(times):.2f} / {statistics.median(times):.2f} / {max(times):.2f}"
        tally = ", ".join(f"{c} x{codes.count(c)}" for c in sorted(set(codes)))
        good = " ".join(f"{g:.2f}" for g in goods)
        print(f"{label:<20} {spread:<38} {max(times) - budget:>+15.2f} {good:>24}  {tally}; good: "
              f"{', '.join(sorted(set(good_codes)))}")


if __name__ == "__main__":
    main()
