# Every shipped config parses, validates and plans; the 14B config has the shape of the
# seed's run (40 layers, 40/8 heads of 128, d_model 5120, d_ff 17408, seq 4096, vocab
# 128256, untied): 14.53B parameters and 93.279 GFLOP/token by the PaLM count
# (BACKGROUND.md: 14.52B, 93.3).
. "$(dirname "$0")/lib.sh"
for conf in configs/*.conf; do
    check "$conf plans" sh -c "'$TRAIN_GPT' plan '$conf' >/dev/null 2>&1"
done
# The plan goes through a file: its text holds quotes ("this rank's pieces") that would end a
# quoted sh -c argument.
plan=$(mktemp); trap 'rm -f "$plan"' EXIT
"$TRAIN_GPT" plan configs/boom-14b.conf >"$plan" 2>/dev/null
check "boom-14b: 40 layers, 40/8 heads of 128" \
    grep -q '40 layers, d_model 5120, 40/8 heads of 128, d_ff 17408, vocab 128256, seq 4096' "$plan"
check "boom-14b: 14.53B parameters, 93.279 GFLOP/token" grep -q 'parameters: 14.53B .* 93.279 GFLOP/token' "$plan"
finish test_configs
