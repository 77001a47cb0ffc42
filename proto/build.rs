//! Generates the tonic client and server from `browser_agent/v1/*.proto` with protox,
//! a pure-Rust protobuf compiler, so building needs no `protoc` on the machine.
//!
//! A second, server-only copy has default stubs (every RPC answers `unimplemented`
//! unless overridden): the control plane's tests build fake agents from it that speak
//! the real wire protocol while implementing only the calls a test needs. The real agent
//! uses the first copy, so the compiler makes it implement every RPC.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "browser_agent/v1/agent.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["."])?;
    tonic_prost_build::configure().compile_fds(descriptors.clone())?;
    let stubs = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("stubs");
    std::fs::create_dir_all(&stubs)?;
    tonic_prost_build::configure()
        .build_client(false)
        .generate_default_stubs(true)
        .out_dir(stubs)
        .compile_fds(descriptors)?;
    Ok(())
}
