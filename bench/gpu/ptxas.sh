#!/usr/bin/env bash
# The compiler's resource report of every GPU kernel, without a GPU: nvcc builds the CUDA
# objects (cuda/*.cu, quant.cu) for one architecture with `-Xptxas -v` into a scratch build
# folder, and the table gives each kernel's registers, stack frame, spill stores / loads and
# static shared memory — spills and stack are local-memory traffic, registers set how many
# blocks share a multiprocessor (65,536 registers each on sm_80 / sm_90).
#
#     bash bench/gpu/ptxas.sh [ARCH]      (default 90: sm_90, the H100 / H200; 80: the A100)
#
# The table goes to stdout and to bench/results/DATE-ptxas-sm_ARCH.txt. Needs nvcc (and
# c++filt for the kernels' names); about a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
arch=${1:-90}
case "$arch" in '' | *[!0-9]*) echo "bench/gpu/ptxas.sh: ARCH is a number such as 90 or 80, not '$arch'" >&2; exit 2 ;; esac
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "bench/gpu/ptxas.sh: no nvcc" >&2; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
objs=$(cd cuda && ls ./*.cu | sed "s|^\./|$scratch/cuda/|; s|\.cu$|.o|")
make -s -j"$(nproc)" BUILD="$scratch" CUDA_ARCH="-gencode arch=compute_$arch,code=sm_$arch" \
    NVCC_WARN="-Xptxas -v" $objs "$scratch/quant.o" >"$scratch/report.txt" 2>&1 ||
    { tail -n 20 "$scratch/report.txt" >&2; echo "bench/gpu/ptxas.sh: the build failed" >&2; exit 1; }
mkdir -p bench/results
out=bench/results/$(date -u +%F)-ptxas-sm_$arch.txt
{
    echo "# bash bench/gpu/ptxas.sh $arch: nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo -)}; no GPU needed"
    printf '%-72s %5s %6s %6s %6s %7s\n' kernel regs stack spillS spillL smem
    # ptxas prints, per entry function: "Compiling entry function 'NAME' for 'sm_XX'", then
    # "Function properties for NAME" with the stack and spills, then "Used N registers, ...".
    awk '
        /Compiling entry function/ { match($0, /'"'"'[^'"'"']*'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2); stack = 0; ss = 0; sl = 0 }
        /bytes stack frame/ { stack = $1 + 0; ss = $5 + 0; sl = $9 + 0 }
        /Used [0-9]+ registers/ {
            regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
            smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH) + 0
            if (name != "") print name "\t" regs "\t" stack "\t" ss "\t" sl "\t" smem
            name = ""
        }' "$scratch/report.txt" | sort -u |
        while IFS=$'\t' read -r name regs stack ss sl smem; do
            pretty=$(echo "$name" | c++filt 2>/dev/null | sed 's/(anonymous namespace):://g; s/(.*//')
            printf '%-72s %5s %6s %6s %6s %7s\n' "${pretty:0:72}" "$regs" "$stack" "$ss" "$sl" "$smem"
        done | sort
    echo "# kernels with spills: $(awk '/bytes spill stores/ && ($5 + 0 > 0 || $9 + 0 > 0)' "$scratch/report.txt" | wc -l)"
} | tee "$out"
echo "bench/gpu/ptxas.sh: wrote $out"
