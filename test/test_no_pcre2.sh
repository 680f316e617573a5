# A build without PCRE2 (make NO_PCRE2=1: what a machine without libpcre2-dev gets), in its own
# build folder (CPU only, to stay fast):
#   1. make says ✗ PCRE2 and the binary links no libpcre2;
#   2. its test_tokenizer passes: loading, decoding, and the unsplit encoding the samples use
#      (tokenizer_encode itself fails naming PCRE2);
#   3. it trains a config that samples (sample_every > 0, as configs/tiny.conf does): one
#      warning that the prompt is encoded without the split regex, the samples printed, exit
#      0. It once failed at the sampler's set-up ("sample_prompt: cannot encode it: ... built
#      without PCRE2"), after the start-up had written metrics.jsonl and joined DiLoCo's group;
#   4. `prepare` refuses before it reads or creates anything: exit 1, one line naming PCRE2
#      (it got as far as its first document);
#   5. the tests of encoding (test_prepare.sh, test_prepare_compressed.sh,
#      test_tokenizer_vectors.sh) pass on it with one "skipped (no PCRE2)" line each and
#      fetch no npm package (they failed: `make test` could not pass in such a build).
# The same build lacks every other optional piece too (NO_MPI=1 NO_OPENSSL=1 NO_BLAS=1, no
# OpenMP: what a bare machine gets):
#   6. diloco_transport = tcp and = mpi are refused in one line naming the missing library, before
#      out_dir is touched (mpi named diloco_replica_id instead, and both wrote out_dir's lock and
#      metrics.jsonl first); mpi's line does not offer tcp, which this build lacks either;
#   7. threads = 2 says the build has no OpenMP (it ran on one thread without a word).
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
B="$BUILD/nopcre2"
make -s NO_PCRE2=1 NO_CUDA=1 NO_MPI=1 NO_OPENSSL=1 NO_BLAS=1 HAVE_OPENMP= BUILD="$B" "$B/train_gpt" "$B/test_tokenizer" \
    >"$tmp/make.out" 2>&1 ||
    { cat "$tmp/make.out"; die "the NO_PCRE2=1 build failed"; }
check "config.txt says ✗ PCRE2 (NO_PCRE2=1)" grep -q "^PCRE2=✗ PCRE2 (NO_PCRE2=1" "$B/config.txt"
check "... and the binary links no libpcre2" sh -c "! ldd '$B/train_gpt' | grep -q pcre2"

"$B/test_tokenizer" >"$tmp/unit.out" 2>&1 || true
check "test_tokenizer without PCRE2: $(tail -n 1 "$tmp/unit.out")" grep -q "test_tokenizer: [0-9]* checks, 0 failed" "$tmp/unit.out"

# One token per byte (GPT-2's byte-level alphabet, no merges): the model's vocabulary is 256.
bytes_tokenizer "$tmp/bytes.json"
"$TOOL" shard "$tmp/train.bin" 256 0 20000 11
rc=0
"$B/train_gpt" test/configs/tiny_test.conf --train_data "$tmp/train.bin" --vocab_size 256 --threads 1 \
    --max_steps 6 --ckpt_keep 0 --out_dir "$tmp/run" --tokenizer "$tmp/bytes.json" --sample_every 3 \
    --sample_prompt "It is a truth" >"$tmp/run.out" 2>"$tmp/run.err" || rc=$?
check "trains with sample_every 3 (exit $rc; $(grep -m 1 error "$tmp/run.err" || true))" test $rc -eq 0
check "one warning: the prompt is encoded without the split regex" \
    sh -c "[ \$(grep -c 'warning: sample_prompt: .*built without PCRE2.*without the split regex' '$tmp/run.err') -eq 1 ]"
check "samples at steps 3 and 6, each starting with the prompt" \
    sh -c "[ \$(grep -c 'sample: It is a truth' '$tmp/run.out') -eq 2 ]"

rc=0
"$B/train_gpt" prepare --quiet --tokenizer "$tmp/bytes.json" --doc_token none --out "$tmp/prep/run" "$tmp/bytes.json" \
    >"$tmp/prep.out" 2>"$tmp/prep.err" || rc=$?
check "prepare: exit 1 ($rc), one line naming PCRE2: $(head -c 200 "$tmp/prep.err")" \
    sh -c "[ $rc -eq 1 ] && [ \$(wc -l <'$tmp/prep.err') -eq 1 ] &&
           grep -q '^train_gpt: error: prepare: .*built without PCRE2.*libpcre2-dev' '$tmp/prep.err'"
check "... and created nothing" test ! -e "$tmp/prep"

for t in test_prepare test_prepare_compressed test_tokenizer_vectors; do
    rc=0
    TRAIN_GPT="$B/train_gpt" BUILD="$B" bash "test/$t.sh" >"$tmp/$t.out" 2>&1 || rc=$?
    check "$t.sh passes on it (exit $rc), with one line: $(head -n 1 "$tmp/$t.out")" \
        sh -c "[ $rc -eq 0 ] && [ \$(wc -l <'$tmp/$t.out') -eq 1 ] && grep -q '^  skipped (no PCRE2): ' '$tmp/$t.out'"
done
check "... and no npm package was fetched" test ! -e "$B/npm"

# 6. and 7.
bare=("$B/train_gpt" test/configs/tiny_test.conf --train_data "$tmp/train.bin" --vocab_size 256 --max_steps 2
    --warmup_steps 0)
make_secret "$tmp/secret"
for t in tcp mpi; do
    rc=0
    "${bare[@]}" --out_dir "$tmp/$t" --diloco_replicas 2 --diloco_replica_id 0 --diloco_transport "$t" \
        --diloco_rendezvous 127.0.0.1:1 --diloco_secret_file "$tmp/secret" >/dev/null 2>"$tmp/$t.err" || rc=$?
    eval "rc_$t=$rc"
done
check "diloco_transport = tcp without OpenSSL: one line, out_dir untouched (rc $rc_tcp)" \
    sh -c "[ $rc_tcp -eq 1 ] && [ \$(grep -c 'error:' '$tmp/tcp.err') -eq 1 ] &&
           grep -q 'diloco_transport = tcp: this train_gpt was built without OpenSSL' '$tmp/tcp.err' && test ! -e '$tmp/tcp'"
check "diloco_transport = mpi without MPI: one line naming MPI, not offering tcp, out_dir untouched (rc $rc_mpi)" \
    sh -c "[ $rc_mpi -eq 1 ] && [ \$(grep -c 'error:' '$tmp/mpi.err') -eq 1 ] &&
           grep -q 'diloco_transport: mpi, but this build has no MPI (install libopenmpi-dev' '$tmp/mpi.err' &&
           ! grep -q 'diloco_transport = tcp' '$tmp/mpi.err' && test ! -e '$tmp/mpi'"
"${bare[@]}" --out_dir "$tmp/threads" --threads 2 >/dev/null 2>"$tmp/threads.err" || true
check "threads = 2 without OpenMP: a warning naming it" grep -q 'threads = 2: this train_gpt was built without OpenMP' "$tmp/threads.err"
finish test_no_pcre2
