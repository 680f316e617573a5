"""Independent check of DiLoCo's outer step from the tensors train_gpt dumps.

usage: diloco_check.py DUMP_DIR OUTER_LR MOMENTUM QUANT [MAX_QUANT_REL_ERR [NESTEROV [MU_WARMUP
                       [FRAGMENTS [MERGE_ALPHA]]]]]

TRAIN_GPT_DILOCO_DUMP=DIR makes every replica write DIR/outer_<replica>_<k>_<p>.f32 at outer
step k, which syncs fragment p (the whole model when FRAGMENTS = 1): θ before, θᵢ (its local
weights), Δ, m before, m after, θ after, each the fragment's numel fp32 values. This script
recomputes, in float64 and without any train_gpt code:
  Δ      = θ_before − mean over replicas of θᵢ      (the sign convention)
  m      = μₖ·m_before + Δ
  θ      = θ_before − lr·(Δ + μₖ·m)                 (torch.optim.SGD, nesterov=True)
         = θ_before − lr·m                          (NESTEROV = 0: heavy-ball)
  μₖ     = μ·j/W for the fragment's outer step j = ⌊(k − 1)/FRAGMENTS⌋ + 1 < W = MU_WARMUP, else μ
and checks each against the dump, plus that all replicas hold the same bits and that a
fragment's θ before is its previous outer step's θ after. With streaming (overlap > 0) the
replicas also write DIR/merge_<replica>_<k>_<p>.f32: local weights before, θ, local weights
after the merge, which must be α·before + (1 − α)·θ (MERGE_ALPHA = α) and whose θ must be
outer step k's θ after, bit for bit.
Tolerances: Δ, m, θ and a merge are fp32 roundings of float64 results, so each is within one
fp32 rounding (6e-8 relative to the tensor's largest value) of the float64 value; 1e-6
leaves margin for the double-rounding of m that feeds θ, and still catches a flipped
sign (an error of ~2·lr·|Δ+μm|, 1e-4..1e-2 of |θ| here). With quantization the Δ check
compares against the mean of the true Δᵢ with the stated relative L2 bound instead.
"""
import glob
import os
import re
import sys

import numpy as np


def main():
    dump_dir = sys.argv[1]
    lr, mu, quant = float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    max_quant_err = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    nesterov = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    mu_warmup = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    fragments = int(sys.argv[8]) if len(sys.argv) > 8 else 1
    alpha = float(sys.argv[9]) if len(sys.argv) > 9 else None
    steps, merges, fragment_of = {}, {}, {}
    for path in glob.glob(os.path.join(dump_dir, "*.f32")):
        m = re.match(r"(outer|merge)_(\d+)_(\d+)_(\d+)\.f32$", os.path.basename(path))
        assert m, f"{path}: not a dump name"
        kind, replica, k, p = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
        data = np.fromfile(path, dtype=np.float32)
        rows = 6 if kind == "outer" else 3
        assert data.size % rows == 0, f"{path}: {data.size} values, not {rows} tensors"
        (steps if kind == "outer" else merges).setdefault(k, {})[replica] = data.reshape(rows, -1)
        assert fragment_of.setdefault((kind, k), p) == p, f"{path}: outer step {k} has two fragments"
    assert steps, "no dumps found"
    failures = 0
    worst = {"delta": 0.0, "momentum": 0.0, "theta": 0.0}
    last_after = {}  # fragment → θ after of its latest outer step
    for k in sorted(steps):
        reps = steps[k]
        ids = sorted(reps)
        first = reps[ids[0]]
        for r in ids[1:]:
            for i, name in [(0, "θ before"), (2, "Δ"), (4, "m after"), (5, "θ after")]:
                if not np.array_equal(first[i].view(np.uint32), reps[r][i].view(np.uint32)):
                    print(f"FAIL outer step {k}: replica {r}'s {name} differs from replica {ids[0]}'s")
                    failures += 1
        theta_b, delta, m_b, m_a, theta_a = (first[i].astype(np.float64) for i in (0, 2, 3, 4, 5))
        locals_mean = np.mean([reps[r][1].astype(np.float64) for r in ids], axis=0)
        delta_true = theta_b - locals_mean
        scale = max(np.max(np.abs(delta_true)), 1e-30)
        if quant == "none":
            err = np.max(np.abs(delta - delta_true)) / scale
            worst["delta"] = max(worst["delta"], err)
            if err > 1e-6:
                print(f"FAIL outer step {k}: Δ differs from θ − mean θᵢ by {err:.3g} of max|Δ|")
                failures += 1
        else:
            err = np.linalg.norm(delta - delta_true) / max(np.linalg.norm(delta_true), 1e-30)
            worst["delta"] = max(worst["delta"], err)
            if err > max_quant_err:
                print(f"FAIL outer step {k}: quantized Δ is {err:.3g} (relative L2) from θ − mean θᵢ, "
                      f"bound {max_quant_err}")
                failures += 1
        j = (k - 1) // fragments + 1
        mu_k = mu * j / mu_warmup if j < mu_warmup else mu
        m_exp = mu_k * m_b + delta
        err = np.max(np.abs(m_a - m_exp)) / max(np.max(np.abs(m_exp)), 1e-30)
        worst["momentum"] = max(worst["momentum"], err)
        if err > 1e-6:
            print(f"FAIL outer step {k}: momentum off by {err:.3g} of max|m|")
            failures += 1
        theta_exp = theta_b - lr * (delta + mu_k * m_exp if nesterov else m_exp)
        err = np.max(np.abs(theta_a - theta_exp)) / max(np.max(np.abs(theta_exp)), 1e-30)
        worst["theta"] = max(worst["theta"], err)
        if err > 1e-6:
            print(f"FAIL outer step {k}: θ after off by {err:.3g} of max|θ| (sign or formula)")
            failures += 1
        p = fragment_of[("outer", k)]
        if p in last_after and not np.array_equal(last_after[p][1], first[0]):
            print(f"FAIL outer step {k}: θ before is not fragment {p}'s θ after at outer step {last_after[p][0]}")
            failures += 1
        last_after[p] = (k, first[5])
    worst["merge"] = 0.0
    for k in sorted(merges):
        if alpha is None:
            print(f"FAIL merge dumps at outer step {k}, but no MERGE_ALPHA given")
            failures += 1
            break
        if k not in steps or fragment_of[("merge", k)] != fragment_of[("outer", k)]:
            print(f"FAIL merge at outer step {k} has no outer step with the same fragment")
            failures += 1
            continue
        for r, t in merges[k].items():
            before, theta, after = (t[i].astype(np.float64) for i in range(3))
            if not np.array_equal(t[1], steps[k][min(steps[k])][5]):
                print(f"FAIL merge at outer step {k}, replica {r}: θ is not outer step {k}'s θ after")
                failures += 1
            exp = alpha * before + (1 - alpha) * theta
            err = np.max(np.abs(after - exp)) / max(np.max(np.abs(exp)), 1e-30)
            worst["merge"] = max(worst["merge"], err)
            if err > 1e-6:
                print(f"FAIL merge at outer step {k}, replica {r}: local weights off α·local + (1 − α)·θ by {err:.3g}")
                failures += 1
    print(f"diloco_check: {len(steps)} outer steps, {len(merges)} merges, fragments "
          f"{sorted({p for (kind, _), p in fragment_of.items() if kind == 'outer'})}, replicas "
          f"{sorted({r for s in steps.values() for r in s})}, worst relative errors: Δ {worst['delta']:.2e}, "
          f"m {worst['momentum']:.2e}, θ {worst['theta']:.2e}, merge {worst['merge']:.2e}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
