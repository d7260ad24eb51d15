// Compiles the CSI v1 services and kubelet's plugin registration service into tonic servers
// and clients.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    println!("cargo:rerun-if-changed=proto/pluginregistration.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(
            &["proto/csi.proto", "proto/pluginregistration.proto"],
            &["proto"],
        )?;
    Ok(())
}
