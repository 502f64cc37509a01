//! Release builds of the `carapace` binary lay out the functions its start-up and request
//! paths run next to each other (`link/hot-symbols.txt`, written by `bench/symbol_order.py`):
//! the kernel maps a binary's code a window at a time around each page touched, so code spread
//! over the whole text keeps almost all of it resident, and grouped it keeps a few megabytes.
//!
//! This takes the LLVM linker: Rust's own (the default on x86_64 Linux since Rust 1.90), or
//! `ld.lld` on the `PATH` (Debian package `lld`). Without either the binary is linked as usual,
//! only larger in memory, and the build says so.

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=link/hot-symbols.txt");
    let release = env::var("PROFILE").as_deref() == Ok("release");
    let linux = env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    let dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let order = Path::new(&dir).join("link").join("hot-symbols.txt");
    if !release || !linux || !order.is_file() {
        return;
    }
    if !rust_lld_by_default() && !on_path("ld.lld") {
        println!(
            "cargo:warning=no LLVM linker: the carapace binary is linked without its function \
             order (more of it stays in memory); install lld, or build with Rust 1.90 or later"
        );
        return;
    }
    for arg in [
        "-fuse-ld=lld".to_string(),
        format!("-Wl,--symbol-ordering-file={}", order.display()),
        "-Wl,--no-warn-symbol-ordering".to_string(),
    ] {
        println!("cargo:rustc-link-arg-bin=carapace={arg}");
    }
}

/// Whether rustc links this target with its own LLD: x86_64 GNU/Linux from Rust 1.90.
fn rust_lld_by_default() -> bool {
    let x86_64_gnu = env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64")
        && env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let minor = Command::new(rustc)
        .arg("-V")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            let version = v.split_whitespace().nth(1)?.to_owned();
            version.split('.').nth(1)?.parse::<u32>().ok()
        });
    x86_64_gnu && minor.is_some_and(|m| m >= 90)
}

fn on_path(program: &str) -> bool {
    env::var_os("PATH")
        .is_some_and(|paths| env::split_paths(&paths).any(|d| d.join(program).is_file()))
}
