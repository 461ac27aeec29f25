fn main() {
    std::process::exit(fulcrum::cli::main());
}
