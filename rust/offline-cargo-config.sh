# Sourced by the check scripts: writes DIR/.cargo/config.toml, the offline setup the tinyloop crate's README gives a
# consumer (crates from Debian's registry, $TINYLOOP_CARGO_REGISTRY or /usr/share/cargo/registry).
write_offline_cargo_config() {
  mkdir -p "$1/.cargo"
  cat >"$1/.cargo/config.toml" <<EOF_CONFIG
[source.crates-io]
replace-with = "debian"

[source.debian]
directory = "${TINYLOOP_CARGO_REGISTRY:-/usr/share/cargo/registry}"

[net]
offline = true
EOF_CONFIG
}
