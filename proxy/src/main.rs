//! ferro-proxy entry point.

fn main() {
    eprintln!("ferro-proxy: not wired yet");
    std::process::exit(1);
}
