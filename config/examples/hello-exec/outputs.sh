#!/bin/sh
# Outputs of the exec example: a JSON object on stdout.
set -eu
bytes=0
[ -f rendered/index.html ] && bytes=$(wc -c < rendered/index.html | tr -d ' ')
printf '{"page": "%s/rendered/index.html", "bytes": %s}\n' "$(pwd)" "$bytes"
