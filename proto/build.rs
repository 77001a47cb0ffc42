//! Generates the tonic client and server from `browser_agent/v1/*.proto` with protox,
//! a pure-Rust protobuf compiler, so building needs no `protoc` on the machine. The
//! tests' fake agents are generated from the same file by `proto/fake`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "browser_agent/v1/agent.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["."])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
