//! Generates a server-only copy of `browser_agent/v1/agent.proto` with default stubs:
//! every RPC answers `unimplemented` unless a fake overrides it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "browser_agent/v1/agent.proto";
    println!("cargo:rerun-if-changed=../{proto}");
    let descriptors = protox::compile([proto], [".."])?;
    tonic_prost_build::configure()
        .build_client(false)
        .generate_default_stubs(true)
        .compile_fds(descriptors)?;
    Ok(())
}
