//! Compiles every `.proto` under the workspace's `proto/` directory into Rust
//! (messages, clients, servers, and proto3-JSON serde impls via pbjson) and
//! writes the descriptor set that the reflection service serves.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?)
        .join("../../proto")
        .canonicalize()?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);

    let mut protos = Vec::new();
    collect(&root.join("ctrlplane"), &mut protos)?;
    protos.sort();
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    println!("cargo:rerun-if-env-changed=PROTOC");

    // Honour a PROTOC already set (e.g. Debian's protobuf-compiler);
    // otherwise use the vendored binary so no system install is needed.
    let protoc = match std::env::var_os("PROTOC") {
        Some(p) => PathBuf::from(p),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    let mut config = prost_build::Config::new();
    config.protoc_executable(&protoc);

    let descriptor_path = out.join("ctrlplane_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        // Well-known types come from pbjson-types so that they serialize to
        // canonical proto3 JSON too.
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_with_config(
            config,
            &protos,
            &[root, protoc_bin_vendored::include_path()?],
        )?;

    // google.rpc error details (BadRequest, …): only a descriptor set, so
    // reflection can describe the details our errors carry and grpcurl can
    // print them. The types themselves come from tonic-types.
    let vendor = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("vendor");
    let error_details = vendor.join("google/rpc/error_details.proto");
    println!("cargo:rerun-if-changed={}", error_details.display());
    let status = std::process::Command::new(&protoc)
        .arg("--include_imports")
        .arg(format!(
            "--descriptor_set_out={}",
            out.join("google_rpc_descriptor.bin").display()
        ))
        .arg(format!("-I{}", vendor.display()))
        .arg(format!(
            "-I{}",
            protoc_bin_vendored::include_path()?.display()
        ))
        .arg(&error_details)
        .status()?;
    if !status.success() {
        return Err(format!("protoc failed on {}", error_details.display()).into());
    }

    let descriptors = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .build(&[".ctrlplane"])?;
    Ok(())
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}
