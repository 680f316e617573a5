# The CPU backend against an independent PyTorch model (test/torch_reference.py): logits,
# loss, every gradient, and three AdamW steps with clipping and warmup, for the tied and
# untied head and for the plain variant (no QK-norm, no document mask, RoPE everywhere,
# MQA, sqrt decay).
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
conf=test/configs/reference.conf
"$PYTHON" -c "import torch" 2>/dev/null || die "PyTorch is not importable by $PYTHON (install python3-torch)"
run_variant() {
    local name=$1; shift
    "$BUILD/reference_dump" "$conf" "$tmp/$name" "$@" >/dev/null
    say "variant $name:"
    "$PYTHON" test/torch_reference.py "$tmp/$name"
}
run_variant tied
run_variant untied --tie_embeddings 0
run_variant plain --qk_norm 0 --doc_masking 0 --nope_every 0 --n_kv_head 1 --max_steps 3 --warmup_steps 1 \
    --decay_frac 0.67 --decay_shape sqrt --lr 3e-3
say "test_torch_reference: all variants agree"
