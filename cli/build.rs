//! Says which outside services (PostgreSQL, libfaketime, Chromium) the tests can
//! reach; the tests that need one are ignored, visibly, where it cannot be had.

fn main() {
    spool_testkit_services::emit();
}
