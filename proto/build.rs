//! Generates Rust from `router.proto` with a pure-Rust protobuf compiler, so no
//! system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=router.proto");
    let fds = protox::compile(["router.proto"], ["."])?;
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_server(grpc)
        .build_client(grpc)
        .compile_fds(fds)?;
    Ok(())
}
