// The request path allocates a few small objects per request (header maps, futures,
// body frames); mimalloc's thread-local free lists make those measurably cheaper than
// glibc's malloc (see docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(fulcrum::cli::main());
}
