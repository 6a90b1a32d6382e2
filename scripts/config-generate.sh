#!/usr/bin/env bash
# Writes the files in config/ that are generated from the settings in
# Sources/TrunkSync/Configuration/Setting.swift: config/defaults.json whole, and the settings
# table of config/README.md between its marker lines (the prose around it stays). Run it after
# adding or changing a setting; ConfigurationFilesTests fails while the committed files differ.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product trunk-sync >&2
bin="$(swift build --show-bin-path)/trunk-sync"

"$bin" config defaults --json > config/defaults.json.new
mv config/defaults.json.new config/defaults.json

start='<!-- settings table: generated from Sources/TrunkSync/Configuration/Setting.swift by scripts/config-generate.sh; do not edit -->'
end='<!-- end of generated settings table -->'
grep -qxF "$start" config/README.md && grep -qxF "$end" config/README.md || {
  echo "config/README.md lacks the marker lines around its settings table:" >&2
  printf '  %s\n  %s\n' "$start" "$end" >&2
  exit 1
}
"$bin" config defaults --markdown > config/README.table.tmp
awk -v start="$start" -v end="$end" -v table=config/README.table.tmp '
  $0 == end { skipping = 0 }
  !skipping { print }
  $0 == start { skipping = 1; print ""; while ((getline line < table) > 0) print line; print "" }
' config/README.md > config/README.md.new
rm config/README.table.tmp
mv config/README.md.new config/README.md
echo "config/defaults.json and config/README.md regenerated" >&2
