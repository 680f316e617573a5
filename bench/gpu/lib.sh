# bench/gpu/lib.sh — what the GPU benchmark scripts share (sourced from the repository root).

# key CONF NAME: a key's value in a .conf file (comments and spaces stripped).
key() { awk -F= -v k="$2" '{split($2, a, "#"); gsub(/ /, "", $1); gsub(/ /, "", a[1])} $1 == k {print a[1]}' "$1"; }

# gpu_tag: the first GPU's name as a file-name part ("NVIDIA-H100-80GB-HBM3"); empty without one.
gpu_tag() {
    nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' |
        sed 's/-$//'
}
