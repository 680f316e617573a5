# The layout docs/architecture.md describes, checked so that it stays true:
#   1. the root holds exactly the design card's files and folders (plus dotfiles);
#   2. no file in a folder includes anything above it: llmc/ only llmc/; cpu/, net/, tok/
#      and cuda/ only their own folder and llmc/; nothing in a folder includes a root file;
#   3. no backend branch left in the loop: train_gpt.cu creates the backend in one place;
#   4. the tracked tree stays small enough to travel to a lent GPU (the device tool sends the
#      working tree and refuses one over 64 MiB; 40 MiB leaves room for what a call carries).
# A check fails by naming the file and line that breaks the rule.
. "$(dirname "$0")/lib.sh"

# 1. The root, as git tracks it (a copy without git: as the directory holds it, build
# outputs aside).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    root=$(git ls-files | cut -d/ -f1 | sort -u)
else
    root=$(ls -A | grep -vxE 'build|train_gpt|out|data|node_modules' | sort -u)
fi
allowed='train_gpt.cu diloco.c diloco.h quant.cu dataloader.h Makefile README.md
         llmc cpu cuda net tok configs scripts test docs bench'
extra=""
for f in $root; do
    case " $(echo $allowed) " in *" $f "*) continue ;; esac
    case "$f" in .*) continue ;; esac
    extra="$extra $f"
done
check "the root holds only the card's files and folders (extra:${extra:- none})" test -z "$extra"
for f in $allowed; do check "the root has $f" test -e "$f"; done

# 2. Includes, folder by folder.
bad=0
for dir in llmc cpu net tok cuda; do
    case $dir in llmc) ok='llmc' ;; *) ok="$dir|llmc" ;; esac
    while IFS= read -r hit; do
        [ -n "$hit" ] || continue
        say "  FAIL $dir/ includes above itself: $hit"
        bad=$((bad + 1))
    done < <(grep -n '#include "' "$dir"/*.c "$dir"/*.h "$dir"/*.cu "$dir"/*.cuh 2>/dev/null |
        grep -vE "#include \"($ok)/[A-Za-z0-9_]+\.(h|cuh)\"")
done
check "folders include only their own folder and llmc/ ($bad violations)" test "$bad" -eq 0

# 3. One place picks the backend; the loop calls the interface.
check "train_gpt.cu creates the backend in one place" \
    test "$(grep -c 'cpu_backend_create\|gpu_backend_create(&' train_gpt.cu)" -eq 2
check "the training loop calls no backend directly (cuda_*/cpu_forward_*)" sh -c \
    "sed -n '/^\/\/ =* the training loop/,\$p' train_gpt.cu | grep -nE '\\b(cuda_[a-z_]+|cpu_forward_[a-z_]+|cpu_model_create)\\(' | grep -v plan_bytes; test \$? -ne 0"
# 4. The size of what travels: the tracked files (committed results keep large metrics.jsonl
# gzipped, bench/diloco/README.md).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    bytes=$(git ls-files -z | xargs -0 cat 2>/dev/null | wc -c)
    check "the tracked tree is $((bytes / 1048576)) MiB, within 40 MiB (largest: $(git ls-files -z | xargs -0 du -b 2>/dev/null | sort -n | tail -n 1 | cut -f2))" \
        test "$bytes" -le $((40 * 1048576))
fi
finish test_layout
