# The CPU backend against an independent PyTorch model:
#  1. test/torch_reference.py: logits, loss, every gradient, and three AdamW steps with clipping
#     and warmup, for the tied and untied head and for the plain variant (no QK-norm, no
#     document mask, RoPE everywhere, MQA, sqrt decay).
#  2. test/torch_train_replay.py: the training loop itself (train_gpt from weights loaded with
#     init_from, a checkpoint per step) against a float64 replay: the loader's rows, the WSD
#     schedule, clipping, AdamW's groups, the logged loss, grad_norm and lr, every weight after
#     every step, the final val_loss. Variants: the base; grad_accum 3 (the mean over
#     micro-batches); every token a doc_token; a skipped step (NaN gradient: weights and AdamW's
#     count unchanged); an untied head with sqrt decay and odd shapes (T 37 across the
#     attention's 32-row tiles, 5 heads of 10, documents of 5-40 tokens); 3 shards of 50 tokens
#     whose rows cross shards and wrap the epoch.
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
say "the training loop against a float64 replay:"
replay() {  # replay NAME [--key value]...: test/torch_train_replay.py's verdict is the check
    local name=$1
    shift
    check "training loop, $name" env TOOL="$TOOL" TRAIN_GPT="$TRAIN_GPT" "$PYTHON" test/torch_train_replay.py \
        "$tmp/replay" "$name" "$@"
}
replay base
replay accum --grad_accum 3
replay alldocs --doc_range 1:1
replay skipped --skip 2
replay odd --tie_embeddings 0 --decay_shape sqrt --max_steps 7 --decay_frac 0.6 --warmup_steps 1 --vocab_size 61 \
    --d_model 20 --n_head 5 --n_kv_head 5 --head_dim 10 --d_ff 30 --seq_len 37 --batch_size 3 --doc_range 5:40
replay shards --ntok 50 --nshards 3 --max_steps 8
finish test_torch_reference
