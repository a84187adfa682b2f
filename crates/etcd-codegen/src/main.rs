//! Generates putex's etcd gRPC code (`crates/putex/generated/etcd/`, included by `crates/putex/src/store/etcd/api/`)
//! from etcd's `.proto` files (`proto/`, see `proto/README.md`), in Rust
//! alone: protox compiles the files, tonic-prost-build writes the prost
//! messages and the tonic clients. Nothing runs protoc, here or in any
//! build of putex, which compiles the committed output.
//!
//! ```text
//! cargo run -p etcd-codegen              # writes the generated files
//! cargo run -p etcd-codegen -- --check   # fails naming each file that differs (scripts/test)
//! ```
//!
//! The check fails when the committed code is not what these protos and
//! the locked tonic-prost-build give: after a hand edit, after new protos,
//! or after an upgrade of tonic or prost that changes the generated code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The files whose code putex uses: the KV, Watch, Lease, Cluster,
/// Maintenance and Auth services and the messages they carry. (`version.proto`
/// is only imported: its options annotate fields and generate nothing.)
const PROTOS: [&str; 3] = [
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/api/mvccpb/kv.proto",
    "etcd/api/authpb/auth.proto",
];

/// What the HTTP/JSON gateway's annotations are imported from.
const GATEWAY_IMPORTS: [&str; 2] = [
    "import \"google/api/annotations.proto\";",
    "import \"protoc-gen-openapiv2/options/annotations.proto\";",
];

/// How the gateway's options start: each is removed up to its `;`.
const GATEWAY_OPTIONS: [&str; 2] = ["option (google.api.http)", "option (grpc.gateway."];

/// The folder of the inputs.
fn proto_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("proto")
}

/// The folder of the committed output.
fn api_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../putex/generated/etcd")
}

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("etcd-codegen: unknown argument {other}; usage: etcd-codegen [--check]");
            return ExitCode::from(2);
        }
    };
    let generated = match generate(&proto_dir()) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("etcd-codegen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = api_dir();
    let stale = match stale_files(&generated, &dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("etcd-codegen: reading {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    };
    if check {
        if stale.is_empty() {
            return ExitCode::SUCCESS;
        }
        eprintln!(
            "etcd-codegen: {} is not what crates/etcd-codegen generates ({}); run `cargo run -p etcd-codegen` and commit the result",
            dir.display(),
            stale.join(", ")
        );
        return ExitCode::FAILURE;
    }
    match write(&generated, &dir, &stale) {
        Ok(()) => {
            for name in &stale {
                eprintln!("etcd-codegen: wrote {name}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("etcd-codegen: writing {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

/// The generated files (name → text), from the protos under `proto_dir`.
fn generate(proto_dir: &Path) -> Result<BTreeMap<String, String>, String> {
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(WithoutGateway(proto_dir.to_owned()));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler
        .include_source_info(true)
        .include_imports(false)
        .open_files(PROTOS)
        .map_err(|e| format!("compiling {}: {e:?}", proto_dir.display()))?;
    let fds = compiler.file_descriptor_set();

    let out = scratch_dir().map_err(|e| format!("a scratch directory: {e}"))?;
    let result = tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(&out)
        .compile_fds(fds)
        .map_err(|e| format!("generating code: {e}"))
        .and_then(|()| read_rs_files(&out).map_err(|e| format!("reading the output: {e}")));
    let _ = std::fs::remove_dir_all(&out);
    result
}

/// Every `.rs` file in `dir` (name → text).
fn read_rs_files(dir: &Path) -> std::io::Result<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            files.insert(name.into_owned(), std::fs::read_to_string(&path)?);
        }
    }
    Ok(files)
}

/// An empty directory of this process's own.
fn scratch_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("etcd-codegen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The names of the files in `dir` that differ from `generated`: changed,
/// missing, or generated before but no longer (every `.rs` file there but
/// `mod.rs`, which is written by hand).
fn stale_files(generated: &BTreeMap<String, String>, dir: &Path) -> std::io::Result<Vec<String>> {
    let mut committed = read_rs_files(dir)?;
    committed.remove("mod.rs");
    let mut stale: Vec<String> = generated
        .iter()
        .filter(|(name, text)| committed.get(*name) != Some(text))
        .map(|(name, _)| name.clone())
        .collect();
    stale.extend(
        committed
            .keys()
            .filter(|name| !generated.contains_key(*name))
            .cloned(),
    );
    Ok(stale)
}

/// Writes the stale files: the changed ones anew, leftovers removed.
fn write(
    generated: &BTreeMap<String, String>,
    dir: &Path,
    stale: &[String],
) -> std::io::Result<()> {
    for name in stale {
        match generated.get(name) {
            Some(text) => std::fs::write(dir.join(name), text)?,
            None => std::fs::remove_file(dir.join(name))?,
        }
    }
    Ok(())
}

/// Opens the protos under a folder, without the gateway's annotations.
struct WithoutGateway(PathBuf);

impl protox::file::FileResolver for WithoutGateway {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        let path = self.0.join(name);
        let source = match std::fs::read_to_string(&path) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(protox::Error::file_not_found(name))
            }
            Err(e) => return Err(protox::Error::new(e)),
        };
        let source = without_gateway(&source).map_err(|e| {
            protox::Error::new(std::io::Error::other(format!("{}: {e}", path.display())))
        })?;
        protox::file::File::from_source(name, &source)
    }
}

/// `source` without the HTTP/JSON gateway's imports and options
/// (`option (google.api.http) = {…};`, `option (grpc.gateway.…) = {…};`):
/// they describe REST routes, produce no Rust, and would need googleapis'
/// and grpc-gateway's protos. Anything else is left as it is, so that an
/// annotation of another kind fails the compilation instead of vanishing.
fn without_gateway(source: &str) -> Result<String, String> {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = GATEWAY_OPTIONS.iter().filter_map(|o| rest.find(o)).min() {
        out.push_str(&rest[..start]);
        let len = statement_len(&rest[start..]).ok_or_else(|| {
            format!(
                "an option without its end: {}",
                &rest[start..].lines().next().unwrap_or("")
            )
        })?;
        rest = &rest[start + len..];
    }
    out.push_str(rest);
    Ok(out
        .lines()
        .filter(|line| !GATEWAY_IMPORTS.contains(&line.trim()))
        .map(|line| format!("{line}\n"))
        .collect())
}

/// The length of the statement `text` starts with, up to and with its
/// `;` outside braces and string literals; `None` if it does not end.
fn statement_len(text: &str) -> Option<usize> {
    let (mut depth, mut quote, mut escaped) = (0usize, None, false);
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(_), _) if escaped => escaped = false,
            (Some(_), '\\') => escaped = true,
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '{') => depth += 1,
            (None, '}') => depth = depth.checked_sub(1)?,
            (None, ';') if depth == 0 => return Some(i + 1),
            (None, _) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed code is what the protos give. This is the check
    /// `scripts/test` runs (also as `cargo run -p etcd-codegen -- --check`).
    #[test]
    fn the_committed_code_is_current() {
        let generated = generate(&proto_dir()).unwrap();
        assert!(
            generated.contains_key("etcdserverpb.rs"),
            "{:?}",
            generated.keys()
        );
        let stale = stale_files(&generated, &api_dir()).unwrap();
        assert!(
            stale.is_empty(),
            "{} is not what crates/etcd-codegen generates ({}): run `cargo run -p etcd-codegen` and commit the result",
            api_dir().display(),
            stale.join(", ")
        );
    }

    /// The check fails for a file edited, missing, or left over.
    #[test]
    fn the_check_catches_an_edit_a_missing_file_and_a_leftover() {
        let dir = scratch_dir().unwrap().join("api");
        std::fs::create_dir_all(&dir).unwrap();
        let generated: BTreeMap<String, String> = [("a.rs", "a\n"), ("b.rs", "b\n")]
            .into_iter()
            .map(|(n, t)| (n.to_owned(), t.to_owned()))
            .collect();
        std::fs::write(dir.join("mod.rs"), "// by hand\n").unwrap();
        write(&generated, &dir, &["a.rs".into(), "b.rs".into()]).unwrap();
        assert!(stale_files(&generated, &dir).unwrap().is_empty());

        std::fs::write(dir.join("a.rs"), "a, edited\n").unwrap();
        assert_eq!(stale_files(&generated, &dir).unwrap(), ["a.rs"]);
        std::fs::remove_file(dir.join("a.rs")).unwrap();
        assert_eq!(stale_files(&generated, &dir).unwrap(), ["a.rs"]);
        std::fs::write(dir.join("c.rs"), "c\n").unwrap();
        let stale = stale_files(&generated, &dir).unwrap();
        assert_eq!(stale, ["a.rs", "c.rs"]);

        write(&generated, &dir, &stale).unwrap();
        assert!(stale_files(&generated, &dir).unwrap().is_empty());
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    /// The gateway's imports and options go, nested braces, strings and
    /// all; other options stay.
    #[test]
    fn the_gateway_annotations_are_removed_and_nothing_else() {
        let source = r#"syntax = "proto3";
import "etcd/api/mvccpb/kv.proto";
import "google/api/annotations.proto";
import "protoc-gen-openapiv2/options/annotations.proto";
option (grpc.gateway.protoc_gen_openapiv2.options.openapiv2_swagger) = {
  security: { key: "a;}"; value: {} }
};
service KV {
  // Range gets the keys.
  rpc Range(RangeRequest) returns (RangeResponse) {
      option (google.api.http) = {
        post: "/v3/kv/range"
        body: "*"
    };
  }
}
message M { option (versionpb.etcd_version_msg) = "3.0"; }
"#;
        let stripped = without_gateway(source).unwrap();
        assert!(!stripped.contains("google"), "{stripped}");
        assert!(!stripped.contains("gateway"), "{stripped}");
        assert!(!stripped.contains("/v3/kv/range"), "{stripped}");
        assert!(stripped.contains("import \"etcd/api/mvccpb/kv.proto\";"));
        assert!(stripped.contains("// Range gets the keys."));
        assert!(stripped.contains("rpc Range(RangeRequest) returns (RangeResponse) {"));
        assert!(stripped.contains("option (versionpb.etcd_version_msg) = \"3.0\";"));
        assert!(without_gateway("option (google.api.http) = { post: \"x\"").is_err());
    }
}
