# test/test_gpu_train.sh in `make test`: device = cuda on the CPU emulator of the GPU
# (build/train_gpt_emu: train_gpt.cu's GPU model on test/warp_emu.h and test/cublaslt_emu.h),
# on a smaller model and 20 steps (GPU_TRAIN_EMULATED=1), then 8 at 2 sequences per micro-batch.
# So the GPU backend's wiring (the step, validation, checkpoints written from and read into the
# GPU model, resume across devices, device = auto, rows after the first) is checked against the
# CPU backend in CI, not only on a GPU.
#
# The model's stream is deferred (TRAIN_GPT_EMU_DEFER=first, test/warp_emu.h): its kernels and
# copies run only when the host waits for them, so a result read before its wait (pinned
# memory read too early, an input slot reused too soon) is garbage here, as it can be on a
# GPU. (Planted: validation's loss read without its wait → val_loss 1.8e-315.)
TRAIN_GPT_EMU_DEFER=first GPU_TRAIN_EMULATED=1 TRAIN_GPT="$BUILD/train_gpt_emu" exec bash "$(dirname "$0")/test_gpu_train.sh"
