#!/usr/bin/python3
"""Tables and plots for the DiLoCo convergence benchmark (bench/diloco/convergence.sh).

    /usr/bin/python3 bench/diloco/plot_convergence.py OUT [--title TEXT]

Reads OUT/results.tsv (one row per run: name kind M H outer_lr mu nesterov mu_warmup steps
seed start val_loss val_tokens seconds) and, for every row, OUT/<name>/metrics.jsonl (its
validation lines, each placed at the training tokens of the step line of the same step).

Writes:
  * markdown to stdout and to OUT/summary.md: one table per (steps, seed, start) with each
    run's final val_loss against the one-worker run and against data parallel with the same M,
    then, where a configuration ran with several seeds, a table of statistics across seeds;
  * OUT/curves-<steps>-<start>.svg: val_loss against training tokens per replica for the
    smallest seed of each (steps, start), one line per run.

Standard library only (Python 3.9 or later). --title TEXT prefixes every title.
"""
import gzip
import json
import math
import os
import re
import statistics
import sys
from xml.sax.saxutils import escape

DASH = "—"
KIND_RANK = {"one": 0, "dp": 1, "diloco": 2}
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"]
DASHES = ["", "6 3", "2 2", "8 3 2 3"]
CONFIG_KEYS = ("kind", "M", "H", "outer_lr", "mu", "nesterov", "mu_warmup", "steps", "start")


# ---------------------------------------------------------------------------------- input

def parse_args(argv):
    """(OUT, title prefix) from the command line."""
    out, title, args = None, "", list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--title" and args:
            title = args.pop(0)
        elif arg.startswith("--title="):
            title = arg.split("=", 1)[1]
        elif out is None and not arg.startswith("--"):
            out = arg
        else:
            sys.exit("usage: plot_convergence.py OUT [--title TEXT]")
    if out is None:
        sys.exit("usage: plot_convergence.py OUT [--title TEXT]")
    return out, title


def number(text):
    """A float from text, or None when it is empty, '-' or not a number."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def sort_number(text):
    """A key that sorts numbers numerically and puts anything else ('-') first."""
    value = number(text)
    return (0, 0.0, text) if value is None else (1, value, "")


def read_results(path):
    """The rows of results.tsv as dicts, with val_loss a float or None."""
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    if not lines:
        return []
    header = lines[0].split("\t")
    rows = []
    for line in lines[1:]:
        fields = line.split("\t")
        row = dict(zip(header, fields + [""] * (len(header) - len(fields))))
        row["val"] = number(row.get("val_loss"))
        row["m"] = number(row.get("M")) or 1.0
        rows.append(row)
    return rows


def read_curve(path):
    """[(training tokens, val_loss)] from a metrics.jsonl, or from its gzipped copy (committed
    results keep the large ones as metrics.jsonl.gz); [] when neither is there."""
    tokens, vals = {}, []
    try:
        if not os.path.exists(path) and os.path.exists(path + ".gz"):
            with gzip.open(path + ".gz", "rt", encoding="utf-8") as f:
                lines = f.readlines()
        else:
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
    except OSError:
        return []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or "event" in rec or "outer_step" in rec or "step" not in rec:
            continue
        if "val_loss" in rec:
            vals.append((rec["step"], rec["val_loss"]))
        elif "tokens" in rec:
            tokens[rec["step"]] = rec["tokens"]
    return [(float(tokens[s]), float(v)) for s, v in vals
            if s in tokens and isinstance(v, (int, float))]


# ------------------------------------------------------------------------------- markdown

def pct(value, reference):
    """'+3.81 %' for value against reference, or — when either is missing."""
    if value is None or not reference:
        return DASH
    return f"{100 * (value / reference - 1):+.2f} %"


def fmt_val(value):
    return DASH if value is None else f"{value:.4f}"


def row_order(row):
    return (KIND_RANK.get(row["kind"], 3), row["m"], sort_number(row["H"]),
            row["val"] is None, row["val"] or 0.0, row["name"])


def group_key(row):
    return (sort_number(row["steps"]), sort_number(row["seed"]), row["start"])


def find(rows, kind, m=None):
    """The first row of the given kind (and M) that has a val_loss."""
    for row in rows:
        if row["kind"] == kind and row["val"] is not None and (m is None or row["m"] == m):
            return row
    return None


def table(header, body):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in cells) + " |" for cells in body]
    return lines


def group_table(rows):
    """The markdown table of one (steps, seed, start) group."""
    one = find(rows, "one")
    body = []
    for row in sorted(rows, key=row_order):
        ref = row["kind"] in ("one", "dp")
        dp = None if ref else find(rows, "dp", row["m"])
        body.append([row["name"], row["kind"], row["M"], row["H"], row["outer_lr"], row["mu"],
                     row["nesterov"], row["mu_warmup"], fmt_val(row["val"]),
                     DASH if row is one else pct(row["val"], one and one["val"]),
                     pct(row["val"], dp and dp["val"]), row.get("seconds") or DASH])
    header = ["run", "kind", "M", "H", "outer lr", "μ", "nesterov", "μ warm-up", "val_loss",
              "vs one worker", "vs data parallel (same M)", "seconds"]
    return table(header, body)


def seeds_table(rows):
    """The 'Across seeds' table, or [] when no configuration ran with more than one seed."""
    configs = {}
    for row in rows:
        if row["val"] is not None:
            # The run's name without its seed suffix ("-s2", also before "-warm") tells apart
            # configurations whose differences are in extra keys (results.tsv does not list them).
            base = re.sub(r"-s\d+(?=(-warm)?$)", "", row["name"])
            configs.setdefault((base,) + tuple(row[k] for k in CONFIG_KEYS), []).append(row)
    dps = {(r["m"], r["steps"], r["start"], r["seed"]): r["val"]
           for r in rows if r["kind"] == "dp" and r["val"] is not None}
    body = []
    for key, runs in sorted(configs.items(), key=lambda kv: row_order(kv[1][0])
                            + (sort_number(kv[1][0]["steps"]), kv[1][0]["start"])):
        if len({r["seed"] for r in runs}) < 2:
            continue
        vals = [r["val"] for r in runs]
        pairs = [(r["val"], dps.get((r["m"], r["steps"], r["start"], r["seed"])))
                 for r in runs if r["kind"] != "dp"]
        vs_dp = [100 * (val / dp - 1) for val, dp in pairs if dp]
        body.append(list(key) + [len(runs), f"{statistics.mean(vals):.4f}",
                                 f"{statistics.stdev(vals):.4f}", f"{min(vals):.4f}",
                                 f"{max(vals):.4f}",
                                 f"{statistics.mean(vs_dp):+.2f} %" if vs_dp else DASH])
    if not body:
        return []
    header = ["run", "kind", "M", "H", "outer lr", "μ", "nesterov", "μ warm-up", "steps", "start",
              "n seeds", "mean val_loss", "std", "min", "max", "mean vs data parallel"]
    return table(header, body)


def markdown(rows, title, svgs):
    groups = {}
    for row in rows:
        groups.setdefault(group_key(row), []).append(row)
    lines = []
    for key in sorted(groups):
        first = groups[key][0]
        lines += [f"## {title}DiLoCo convergence: {first['steps']} steps, seed {first['seed']}, "
                  f"{first['start']}", ""] + group_table(groups[key]) + [""]
    across = seeds_table(rows)
    if across:
        lines += [f"## {title}Across seeds", ""] + across + [""]
    for name in svgs:
        lines += [f"![{name}]({name})", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ SVG

def nice_step(span, pieces=4):
    """The largest step of 1, 2 or 5 × 10^k that cuts span into at least pieces pieces."""
    raw = span / pieces if span > 0 else 1.0
    exp = math.floor(math.log10(raw))
    return max(m * 10.0 ** e for e in (exp, exp + 1) for m in (1, 2, 5) if m * 10.0 ** e <= raw)


def axis(lo, hi, pad_lo=True):
    """(lo, hi, step): the range with 4 % room each side (none below when not pad_lo)."""
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        lo, hi = lo - (0.05 * abs(lo) or 1.0) * pad_lo, hi + (0.05 * abs(hi) or 1.0)
    pad = 0.04 * (hi - lo)
    lo, hi = lo - pad * pad_lo, hi + pad
    return lo, hi, nice_step(hi - lo)


def tick_label(value, step):
    """A tick label: 1.5M, 200k, 4.25."""
    if abs(value) < step * 1e-6:
        return "0"
    scale, suffix = 1.0, ""
    for s, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if step >= s / 10 and step >= 100:
            scale, suffix = s, suf
            break
    decimals = max(0, -math.floor(math.log10(step / scale) + 1e-9))
    return f"{value / scale:.{decimals}f}{suffix}"


def ticks(lo, hi, step):
    """The multiples of step in [lo, hi]."""
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [i * step for i in range(first, last + 1)]


def text(x, y, s, size=12, anchor="start", extra=""):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
            f"{escape(s)}</text>")


def y_limits(curves):
    """Min over all points to max over the points after the first 20 % of the x range."""
    points = [p for _, pts, _ in curves for p in pts]
    xmax = max(x for x, _ in points)
    late = [y for x, y in points if x >= 0.2 * xmax] or [y for _, y in points]
    return min(y for _, y in points), max(late)


def svg(curves, title, width=900, height=520):
    """A standalone SVG: curves is [(label, [(x, y)], final)], x in tokens per replica."""
    left, right, top, bottom = 72, width - 250, 44, height - 58
    x0, x1, xs = axis(0.0, max(x for _, pts, _ in curves for x, _ in pts), pad_lo=False)
    y0, y1, ys = axis(*y_limits(curves))

    def px(x):
        return left + (x - x0) / (x1 - x0) * (right - left)

    def py(y):
        return bottom - (y - y0) / (y1 - y0) * (bottom - top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<defs><clipPath id="plot"><rect x="{left}" y="{top}" width="{right - left}" '
           f'height="{bottom - top}"/></clipPath></defs>',
           text(width / 2, 26, title, 15, "middle", ' font-weight="bold"')]
    for x in ticks(x0, x1, xs):
        out += [f'<line x1="{px(x):.1f}" y1="{top}" x2="{px(x):.1f}" y2="{bottom + 5}" '
                f'stroke="#ddd"/>', text(px(x), bottom + 19, tick_label(x, xs), 11, "middle")]
    for y in ticks(y0, y1, ys):
        out += [f'<line x1="{left - 5}" y1="{py(y):.1f}" x2="{right}" y2="{py(y):.1f}" '
                f'stroke="#ddd"/>', text(left - 8, py(y) + 4, tick_label(y, ys), 11, "end")]
    out += [f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
            f'fill="none" stroke="#333"/>',
            text((left + right) / 2, height - 14, "training tokens per replica", 13, "middle"),
            text(18, (top + bottom) / 2, "validation loss (nats)", 13, "middle",
                 f' transform="rotate(-90 18 {(top + bottom) / 2:.1f})"')]
    out.append('<g clip-path="url(#plot)" fill="none" stroke-width="1.7">')
    for i, (_, pts, _) in enumerate(curves):
        colour, dash = style(i)
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{coords}" stroke="{colour}"{dash}/>')
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.6" fill="{colour}" '
                f'stroke="none"/>' for x, y in pts]
    out.append("</g>")
    out += legend(curves, right + 16, top + 6, width - 8, bottom)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def style(i):
    """(colour, dash attribute) of the i-th curve."""
    dash = DASHES[(i // len(PALETTE)) % len(DASHES)]
    return PALETTE[i % len(PALETTE)], f' stroke-dasharray="{dash}"' if dash else ""


def legend(curves, x, y, x_end, y_end):
    """Legend rows: line sample, run name and its final val_loss."""
    step = min(18.0, (y_end - y) / max(1, len(curves)))
    size = max(7, min(11, int(step - 3)))
    room = int((x_end - x - 30 - 3.6 * size) / (0.56 * size))
    out = []
    for i, (label, _, final) in enumerate(curves):
        colour, dash = style(i)
        yy = y + i * step + step / 2
        name = label if len(label) <= room else label[:max(1, room - 1)] + "…"
        out += [f'<line x1="{x}" y1="{yy:.1f}" x2="{x + 20}" y2="{yy:.1f}" stroke="{colour}" '
                f'stroke-width="2"{dash}/>',
                f'<circle cx="{x + 10}" cy="{yy:.1f}" r="2.6" fill="{colour}"/>',
                text(x + 26, yy + size * 0.35, name, size),
                text(x_end, yy + size * 0.35, fmt_val(final), size, "end")]
    return out


def curves_for(rows, out):
    """[(name, [(tokens per replica, val_loss)], final val_loss)] of rows with a curve."""
    curves = []
    for row in sorted(rows, key=row_order):
        per = 1.0 if row["kind"] == "one" else row["m"]
        pts = [(t / per, v) for t, v in read_curve(os.path.join(out, row["name"], "metrics.jsonl"))]
        if pts:
            curves.append((row["name"], pts, row["val"] if row["val"] is not None else pts[-1][1]))
    return curves


def write_svgs(rows, out, title):
    """One SVG per (steps, start) for its smallest seed; the file names written."""
    groups = {}
    for row in rows:
        groups.setdefault((sort_number(row["steps"]), row["start"]), []).append(row)
    names = []
    for key in sorted(groups):
        seed = min((r["seed"] for r in groups[key]), key=sort_number)
        curves = curves_for([r for r in groups[key] if r["seed"] == seed], out)
        if not curves:
            continue
        steps, start = groups[key][0]["steps"], groups[key][0]["start"]
        name = f"curves-{steps}-{start}.svg"
        heading = f"{title}DiLoCo convergence: {steps} steps, {start}"
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write(svg(curves, heading + f" (seed {seed})"))
        names.append(name)
    return names


def main(argv):
    out, title = parse_args(argv)
    title = f"{title} — " if title else ""
    path = os.path.join(out, "results.tsv")
    try:
        rows = read_results(path)
    except OSError as e:
        sys.exit(f"plot_convergence: cannot read {path}: {e.strerror}")
    if not rows:
        sys.exit(f"plot_convergence: no runs in {path}")
    svgs = write_svgs(rows, out, title)
    text_md = markdown(rows, title, svgs) + "\n"
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(text_md)
    sys.stdout.write(text_md)


if __name__ == "__main__":
    main(sys.argv[1:])
