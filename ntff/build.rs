//! Generates the Rust types of the NTFF and Perfetto schemas with `prost-build`, parsing
//! the `.proto` files with `protox`, so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/ntff.proto", "proto/perfetto.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
