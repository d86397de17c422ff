"""What a user's first refit did before session 46: the cost model's constants fitted to one program's timings.

    PYTHONPATH=. python benchmarks/results/cost_fit_cpu_2026-11-28_s46/one_row_fits.py

The rows are the shipped entries' GPU timings matched to the search's designs (``cost_vs_measured.fit_rows``, every
registry model). For 24 entries drawn at random, the constants are fitted to that entry alone (``superopt.search.fit``)
and judged on all the others, against the hand-set constants and the fit to every entry.
"""
import math
import random
import statistics
from pathlib import Path

from benchmarks.cost_vs_measured import fit_rows, held_out_summary
from mirage_serve import registry
from superopt.search.cost import DEFAULT_PARAMS
from superopt.search.fit import estimate, fit, score

rows = fit_rows(Path("kernels_cache"), registry.names())
print(f"{len(rows)} entries with 3+ timed designs matched")
print("hand-set constants, on every entry:", held_out_summary(rows, DEFAULT_PARAMS))
random.seed(0)
rhos, geos = [], []
for i in random.sample(range(len(rows)), 24):
    params, _, _ = fit([rows[i]])
    others = rows[:i] + rows[i + 1:]
    rhos.append(score(others, params))
    picks = []
    for row in others:
        est = [estimate(feats, params) for feats, _ in row]
        picks.append(row[est.index(min(est))][1] / min(us for _, us in row))
    geos.append(math.exp(statistics.mean(map(math.log, picks))))
print(f"fitted to one entry, on the others (24 draws): rank correlation mean {statistics.mean(rhos):+.3f} "
      f"(worst {min(rhos):+.3f}); pick / fastest geomean, mean over draws {statistics.mean(geos):.3f} "
      f"(worst {max(geos):.3f})")
