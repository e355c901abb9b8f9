# Sourced by scripts/demo and scripts/test: create .venv and install the project with the
# given extras, again only when pyproject.toml changed (a re-run starts at once, quietly).
ensure_venv() {
    local extras="$1" log
    [ -x .venv/bin/python ] || python3 -m venv .venv
    local stamp=".venv/.installed-$(sha256sum < pyproject.toml | cut -c1-16)-${extras//[^a-z,]/}"
    [ -f "$stamp" ] && return 0
    log=$(mktemp)
    if ! { .venv/bin/python -m pip install -q --upgrade pip \
            && .venv/bin/python -m pip install -q -e ".[${extras}]"; } >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        return 1
    fi
    # setuptools' banner about editable installs is noise here; anything else is shown.
    grep -v -e 'Editable installation' -e '^ *!!$' -e 'same name as your package' \
        -e 'Please be careful with folders' -e '^ *\*\+$' -e '^ *$' \
        -e 'with strategy, WheelFile' -e 'may take precedence during imports' "$log" || true
    rm -f "$log"
    touch "$stamp"
}
