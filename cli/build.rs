//! Says which outside services (PostgreSQL, libfaketime) the tests can reach; the
//! tests that need one are ignored, visibly, where it cannot be had.

#[path = "../tests/support/test_cfg.rs"]
mod test_cfg;

fn main() {
    test_cfg::emit();
}
