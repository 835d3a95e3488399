#!/bin/sh
# The bundled exec example: "deploy" greeting.txt by rendering it into
# rendered/index.html next to it. driftless runs this only when a tracked file
# under this directory (or the command) changed since the last success.
set -eu
mkdir -p rendered
{
  echo "<!doctype html><title>driftless example</title>"
  echo "<pre>"
  cat greeting.txt
  echo "</pre>"
} > rendered/index.html.tmp
mv rendered/index.html.tmp rendered/index.html
echo "rendered $(wc -c < rendered/index.html) bytes into $(pwd)/rendered/index.html"
