#!/bin/sh
# count.sh VENV DSN WAY [EXTRA_MODULE] -> prints total Ir of the counted section
venv=$1; dsn=$2; way=$3; extra=$4
out=$(mktemp /tmp/i11cg.XXXXXX)
here=$(cd "$(dirname "$0")" && pwd)
cd "$here" && PYTHONPATH="$here" valgrind --tool=callgrind --toggle-collect=functools_reduce \
  --callgrind-out-file=$out "$venv/bin/python" ir.py "$dsn" "$way" $extra >/dev/null 2>$out.err || { cat $out.err; exit 1; }
grep -E "^(summary|totals):" $out | head -1 | awk -v w="$way" '{print w, $2}'
rm -f $out $out.err
