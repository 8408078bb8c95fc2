//! Build script: records the commit the binary is built from, for `--version`, the
//! `rpp_build_info` metric and the startup line, so an operator can tell which code runs.
//!
//! `RPP_GIT_COMMIT` wins when set (a container build has no `.git`: pass it with
//! `--build-arg RPP_GIT_COMMIT=$(git rev-parse --short HEAD)`); otherwise `git rev-parse`
//! is asked; without git or outside a checkout (a crate tarball) the commit is `unknown`.
//! No dependency: `git` itself is run, and a missing `git` is not an error.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=RPP_GIT_COMMIT");
    let commit = std::env::var("RPP_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=RPP_COMMIT={}", commit.trim());
    for file in head_files() {
        println!("cargo:rerun-if-changed={}", file.display());
    }
}

/// The trimmed output of `git ARGS` in the crate's directory; `None` when git is missing,
/// fails, or prints nothing.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env_path("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn env_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(name).unwrap_or_default())
}

/// The files whose change means a new commit is checked out: HEAD, the branch it points
/// to, and packed-refs. Only existing ones: Cargo reruns the script on every build for a
/// listed path that does not exist. In a worktree HEAD and the branch live in different
/// directories, hence both `--git-dir` and `--git-common-dir`.
fn head_files() -> Vec<PathBuf> {
    let (Some(git_dir), Some(common)) = (
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ) else {
        return Vec::new();
    };
    let root = env_path("CARGO_MANIFEST_DIR");
    let at = |p: &str| -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            root.join(p)
        }
    };
    let mut files = vec![at(&git_dir).join("HEAD"), at(&common).join("packed-refs")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        files.push(at(&common).join(branch));
    }
    files.into_iter().filter(|f| f.exists()).collect()
}
