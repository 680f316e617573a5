# `train_gpt plot` (docs/plot.md): one SVG dashboard from the runs' metrics.jsonl.
#   1. a plain run and a DiLoCo run (2 replicas simulated in one process) plotted overlaid:
#      well-formed XML; the panels (loss, lr, grad norm, tok/s, the four DiLoCo ones; no MFU
#      on the CPU); each run's series where it has them, every step of a short run drawn;
#      the directory names in the legend, one of them full of XML's special characters;
#   2. the log of a long run that went wrong: 200,000 steps with null values, skipped steps,
#      a rollback and a resume that write steps again (the dead lines hold a loss of 100) and
#      a last line torn by a crash: a small SVG, paths of a few thousand points, the values
#      drawn are the ones written last;
#   3. bad input (a missing directory, no metrics.jsonl, an empty, a garbage or a step-less
#      file, an unwritable output, an unknown option, the output onto a run's metrics.jsonl):
#      one error line naming it, exit 1;
#   4. headless Chromium renders the dashboard: the screenshot is not blank and holds both
#      runs' colours (skipped, saying so, where chromium is not installed);
#   5. a run killed mid-line and resumed: the torn line cut off, every line JSON, the run plots;
#   6. huge values (a loss of 3e38): tick labels in exponent form.
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
"$TOOL" shard "$tmp/val.bin" 64 0 5000 12
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 10
    --val_tokens 256 --threads 1 --log_every 1000 --ckpt_every 0 --max_steps 40)

# svg_check FILE PYTHON-EXPRESSION...: true when every expression holds for the parsed SVG.
# In scope: doc (minidom), panels (ids without "panel-"), series(panel, name, run) (the path
# elements), pairs(path) (its coordinate pairs), ticks(panel) (the y tick values).
svg_check() {
    "$PYTHON" - "$@" <<'PY'
import re, sys, xml.dom.minidom
doc = xml.dom.minidom.parse(sys.argv[1])
groups = {g.getAttribute("id")[len("panel-"):]: g for g in doc.getElementsByTagName("g")
          if g.getAttribute("id").startswith("panel-")}
panels = set(groups)
def series(panel, name, run):
    return [p for p in groups[panel].getElementsByTagName("path")
            if p.getAttribute("data-series") == name and p.getAttribute("data-run") == str(run)]
def pairs(path):  # the coordinate pairs of a path (a dot is one)
    return re.findall(r"-?[\d.]+ -?[\d.]+", path.getAttribute("d"))
def number(label):
    m = re.fullmatch(r"(-?[\d.]+)(e-?\d+)?([KMBT]?)", label)
    return float(m.group(1) + (m.group(2) or "")) * {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[m.group(3)]
def ticks(panel):
    return [number(t.firstChild.data) for t in groups[panel].getElementsByTagName("text")
            if t.getAttribute("class") == "ytick"]
legend = " ".join(t.toxml() for t in doc.getElementsByTagName("text"))
ok = True
for expression in sys.argv[2:]:
    if not eval(expression):
        print("    not true:", expression)
        ok = False
sys.exit(0 if ok else 1)
PY
}
# one_error LOG TEXT: the output is exactly one "train_gpt: error: plot: ..." line holding TEXT.
one_error() {
    [ "$(wc -l <"$1")" -eq 1 ] && grep -q '^train_gpt: error: plot: ' "$1" && grep -qF -- "$2" "$1"
}

# 1.
"$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/plain" >"$tmp/plain.log" 2>&1
"$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/diloco" --diloco_replicas 2 --diloco_transport local \
    --diloco_inner_steps 5 >"$tmp/diloco.log" 2>&1
odd="$tmp/a&b <c> \"d\" 'e'"
mkdir -p "$odd" && cp "$tmp/plain/metrics.jsonl" "$odd/"
"$TRAIN_GPT" plot "$tmp/plain" "$tmp/diloco/" >"$tmp/plot.log" 2>&1
check "plot of two runs: exit 0, the default output in the first run's directory" \
    sh -c "test -s '$tmp/plain/dashboard.svg' && grep -q \"wrote '$tmp/plain/dashboard.svg' (2 runs, 8 panels\" '$tmp/plot.log'"
check "well-formed XML with the panels: loss, lr, grad_norm, tok_per_s and DiLoCo's four; no MFU on the CPU" \
    svg_check "$tmp/plain/dashboard.svg" \
    'panels == {"loss", "lr", "grad_norm", "tok_per_s", "outer_bytes", "outer_seconds", "contributors", "stall_ms"}'
check "both runs in the step panels; train loss of all 40 steps, validation at steps 10..40" \
    svg_check "$tmp/plain/dashboard.svg" \
    'all(series(p, p, r) for p in ("lr", "grad_norm", "tok_per_s") for r in (0, 1))' \
    'all(len(pairs(series("loss", "train_loss", r)[0])) == 40 for r in (0, 1))' \
    'all(len(pairs(series("loss", "val_loss", r)[0])) == 4 for r in (0, 1))'
check "the DiLoCo panels: bytes, seconds, contributors (2 at each of 8 outer steps), stall; only for the DiLoCo run" \
    svg_check "$tmp/plain/dashboard.svg" \
    'all(series(p, s, 1) and not series(p, s, 0) for p, s in [("outer_bytes", "bytes_sent"),
        ("outer_bytes", "bytes_recv"), ("outer_seconds", "sync_s"), ("outer_seconds", "wait_s"),
        ("contributors", "contributors"), ("stall_ms", "stall_ms")])' \
    'len(pairs(series("contributors", "contributors", 1)[0])) == 8 and ticks("contributors")[-1] == 2'
check "the legend names both directories" \
    svg_check "$tmp/plain/dashboard.svg" "'$tmp/plain<' in legend and '$tmp/diloco<' in legend"
"$TRAIN_GPT" plot "$odd" -o "$tmp/odd.svg" >"$tmp/odd.log" 2>&1
check "a directory name with & < > \" ' is escaped: the SVG parses and names it" \
    env ODD="$odd" bash -c "$(declare -f svg_check); PYTHON='$PYTHON' svg_check '$tmp/odd.svg' \
    'any(t.firstChild and t.firstChild.data == __import__(\"os\").environ[\"ODD\"] for t in doc.getElementsByTagName(\"text\"))'"

# 2.
mkdir -p "$tmp/long"
"$PYTHON" - "$tmp/long/metrics.jsonl" <<'PY'
import math, sys
def step(s, loss, extra=""):
    return ('{"step":%d,"loss":%s,"z_loss":0.001,"lr":%g,"grad_norm":%s,"tok_per_s":%d,"mfu":null,'
            '"step_ms":5,"tokens":%d,"skipped":%s%s}\n') % (
        s, loss, 3e-4 * min(1, s / 2000), "null" if s % 1000 == 3 else "%.3f" % (1 + (s * 7919 % 97) / 97),
        250000 + s * 7919 % 5000, s * 4096, "true" if s % 20000 == 7 else "false", extra)
def loss(s):
    return "null" if s % 5000 == 11 else "%.4f" % (3 + 7 * math.exp(-s / 20000) + (s * 104729 % 89) / 445)
with open(sys.argv[1], "w") as f:
    f.write('{"event":"start","step":0}\n')
    for s in range(1, 200001):
        if s == 150001:  # the steps after 149000 got written, then a rollback went back there
            f.write('{"event":"rollback","step":150001,"to_step":149000,"checkpoint":"x"}\n')
            for t in range(149001, 150001):
                f.write(step(t, loss(t)))
        if s == 180001:  # a crash after 180500, resumed from the checkpoint at 180000
            for t in range(180001, 180501):
                f.write(step(t, "100.0"))
            f.write('{"step":180200,"val_loss":100.0,"val_tokens":4096}\n')
            f.write('{"event":"resume","step":180000,"checkpoint":"y"}\n')
        f.write(step(s, "100.0" if 149000 < s <= 150000 else loss(s)))
        if s % 10000 == 0:
            f.write('{"step":%d,"val_loss":%.4f,"val_tokens":4096}\n' % (s, 3.2 + 7 * math.exp(-s / 20000)))
    f.write('{"step":200001,"loss":3.1,"z_lo')  # torn by the crash
PY
"$TRAIN_GPT" plot "$tmp/long" >"$tmp/long.log" 2>&1 || true
check "a 200,000-step log: plotted, with a warning about the torn last line only" \
    sh -c "test -s '$tmp/long/dashboard.svg' && grep -q 'metrics.jsonl:[0-9]*: ignoring the last line' '$tmp/long.log' &&
           [ \$(grep -c 'warning' '$tmp/long.log') -eq 1 ] && ! grep -q error '$tmp/long.log'"
check "... small ($(wc -c <"$tmp/long/dashboard.svg") bytes < 300 KB), no path over 5,000 points" \
    svg_check "$tmp/long/dashboard.svg" \
    "__import__('os').path.getsize(sys.argv[1]) < 300000" \
    'max(len(pairs(p)) for p in doc.getElementsByTagName("path")) <= 5000'
check "... the dead branches (loss 100 before the resume) are not drawn; nulls, skips and the restarts are" \
    svg_check "$tmp/long/dashboard.svg" \
    'max(ticks("loss")) < 20' \
    'sum(p.getAttribute("class") == "skip" for p in groups["loss"].getElementsByTagName("path")) == 10' \
    'sum(p.getAttribute("class") == "restart" for p in groups["loss"].getElementsByTagName("path")) == 2' \
    'series("loss", "train_loss", 0)[1].getAttribute("d").count("M") > 1' \
    'panels == {"loss", "lr", "grad_norm", "tok_per_s"}'

# 3.
rm -f "$tmp/plain/dashboard.svg"
mkdir -p "$tmp/nometrics" "$tmp/empty" "$tmp/garbage" "$tmp/nosteps"
: >"$tmp/empty/metrics.jsonl"
printf 'this is not json\n\001\002\n' >"$tmp/garbage/metrics.jsonl"
printf '{"event":"start","step":0}\n{"step":3,"val_loss":4.2,"val_tokens":64}\n' >"$tmp/nosteps/metrics.jsonl"
bad() {  # bad NAME TEXT ARGS...: plot ARGS fails with one line holding TEXT, writing nothing
    local name=$1 text=$2 rc=0 ok=1; shift 2
    "$TRAIN_GPT" plot "$@" >"$tmp/bad.log" 2>&1 || rc=$?
    { [ $rc -eq 1 ] && one_error "$tmp/bad.log" "$text" && ! test -e "$tmp/plain/dashboard.svg"; } || ok=0
    check "$name: exit 1, one line: $(head -c 300 "$tmp/bad.log")" test $ok -eq 1
}
bad "missing directory" "$tmp/nope" "$tmp/plain" "$tmp/nope"
bad "no metrics.jsonl" "$tmp/nometrics/metrics.jsonl" "$tmp/plain" "$tmp/nometrics"
bad "empty metrics.jsonl" "$tmp/empty/metrics.jsonl" "$tmp/plain" "$tmp/empty"
bad "garbage metrics.jsonl" "$tmp/garbage/metrics.jsonl:1" "$tmp/plain" "$tmp/garbage"
bad "no step lines" "$tmp/nosteps/metrics.jsonl" "$tmp/plain" "$tmp/nosteps"
bad "unwritable output" "$tmp/no/such/dir/x.svg" "$tmp/plain" -o "$tmp/no/such/dir/x.svg"
bad "unknown option" "--width" "$tmp/plain" --width 3
bad "no directory" "no run directory" -o "$tmp/x.svg"
cp "$tmp/plain/metrics.jsonl" "$tmp/plain_metrics.copy"
bad "the output onto a run's metrics.jsonl" "is the metrics.jsonl of run" "$tmp/plain" -o "$tmp/plain/metrics.jsonl"
check "... which stays as it was" cmp -s "$tmp/plain_metrics.copy" "$tmp/plain/metrics.jsonl"

# 4.
"$TRAIN_GPT" plot "$tmp/plain" "$tmp/diloco" -o "$tmp/both.svg" >/dev/null 2>&1
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
    say "  skipped: no chromium (the browser check needs the chromium package)"
else
    timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --disable-dev-shm-usage --user-data-dir="$tmp/chromium" \
        --screenshot="$tmp/both.png" --window-size=1400,1000 "file://$tmp/both.svg" >"$tmp/chromium.log" 2>&1 || true
    check "chromium renders the dashboard: not blank, both runs' colours drawn ($(stat -c %s "$tmp/both.png" 2>/dev/null || echo no) bytes of PNG)" \
        "$PYTHON" - "$tmp/both.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
chunks, at = {}, 8
while at < len(data):
    n, kind = struct.unpack(">I4s", data[at:at + 8])
    chunks.setdefault(kind, []).append(data[at + 8:at + 8 + n])
    at += 12 + n
width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][0][:10])
assert depth == 8 and colour in (2, 6), (depth, colour)
bpp = 3 if colour == 2 else 4
raw, stride = zlib.decompress(b"".join(chunks[b"IDAT"])), width * bpp
rows, prev = [], bytearray(stride)
for y in range(height):
    kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if kind == 1: line[i] = (line[i] + a) & 255
        elif kind == 2: line[i] = (line[i] + b) & 255
        elif kind == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line)
    prev = line
def near(px, rgb):
    return sum(abs(px[k] - rgb[k]) for k in range(3)) < 60
ink = blue = orange = 0
for line in rows:
    for x in range(0, stride, bpp):
        px = line[x:x + 3]
        if px[0] < 240 or px[1] < 240 or px[2] < 240: ink += 1
        if near(px, (0x1f, 0x77, 0xb4)): blue += 1
        if near(px, (0xff, 0x7f, 0x0e)): orange += 1
print("    %dx%d, %d pixels not white, %d blue, %d orange" % (width, height, ink, blue, orange))
sys.exit(0 if ink > 0.02 * width * height and blue > 300 and orange > 300 else 1)
PY
fi

# 5. A run killed mid-line, then resumed: the resumed run cuts the torn line off (a warning says
# how many bytes) before it appends, so that every line reads and the run plots. Before, the
# resume's first line was glued to the torn one and `plot` refused the file for good.
"$TRAIN_GPT" "${common[@]}" --ckpt_every 10 --stop_at_step 20 --out_dir "$tmp/torn" >"$tmp/torn.log" 2>&1
truncate -s -40 "$tmp/torn/metrics.jsonl"
"$TRAIN_GPT" "${common[@]}" --ckpt_every 10 --out_dir "$tmp/torn" >"$tmp/torn2.log" 2>&1
check "a torn last line, then a resume: the line cut off, said once" \
    sh -c "[ \$(grep -c 'ended in a torn line (' '$tmp/torn2.log') -eq 1 ] && [ \$(tail -c 1 '$tmp/torn/metrics.jsonl' | od -An -c | tr -d ' ') = '\\n' ]"
check "... every line of metrics.jsonl is JSON, the resume event among them" \
    "$PYTHON" -c "import json, sys; l = [json.loads(x) for x in open(sys.argv[1])]; sys.exit(0 if any(e.get('event') == 'resume' for e in l) else 1)" \
    "$tmp/torn/metrics.jsonl"
"$TRAIN_GPT" plot "$tmp/torn" >"$tmp/torn_plot.log" 2>&1 && rc=0 || rc=$?
check "... and the run plots (exit $rc)" sh -c "[ $rc -eq 0 ] && test -s '$tmp/torn/dashboard.svg'"
# 6. A diverged run's huge values (a loss of 3e38): tick labels in exponent form, each a number
# (a suffix gave "50000000000000000000E").
mkdir -p "$tmp/huge"
printf '{"step":%d,"loss":%s,"lr":0.001}\n' 1 1e38 2 2e38 3 3e38 >"$tmp/huge/metrics.jsonl"
"$TRAIN_GPT" plot "$tmp/huge" >"$tmp/huge.log" 2>&1 || cat "$tmp/huge.log"
check "a loss of 3e38: the loss panel's tick labels are numbers up to the top" \
    svg_check "$tmp/huge/dashboard.svg" "len(ticks('loss')) >= 2" "max(ticks('loss')) >= 2.5e38"
# One point at a huge x (tokens 1e16, 1e308): the axis widens by the value's size; ±0.5 vanished
# there, and coordinates and tick labels came out nan and inf.
for x in 1e16 1e308 1.7e308; do
    mkdir -p "$tmp/x$x"
    printf '{"step":1,"loss":4.0,"lr":0.001,"tokens":%s}\n' "$x" >"$tmp/x$x/metrics.jsonl"
    "$TRAIN_GPT" plot "$tmp/x$x" >"$tmp/x$x.log" 2>&1 || cat "$tmp/x$x.log"
    check "one point at tokens $x: no nan or inf in the SVG" \
        svg_check "$tmp/x$x/dashboard.svg" "not re.search(r'nan|inf', open(sys.argv[1]).read(), re.I)"
done
finish test_plot
