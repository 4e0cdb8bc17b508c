//! Citus's two-phase commit, asked for by every transaction a loop commits.
//!
//! Citus commits a transaction that modified shards on one worker only in one phase:
//! the worker's COMMIT goes first, before the coordinator's own commit. A coordinator
//! that died between the two would leave a chunk's change committed on its worker with
//! no audit row or checkpoint on the coordinator (and a chain step's change with its
//! step not done), where a drain run again finds rows it changed itself as drifted.
//! In two phases the worker only prepares first; the coordinator's commit record then
//! decides, and Citus's recovery commits or rolls back what was left prepared. Citus
//! already takes two phases for a change on several workers.
//!
//! Citus decides with a flag, which its own `Use2PCForCoordinatedTransaction` sets and
//! every transaction's end clears; it changes nothing in a transaction that modified no
//! shard. The function is found, not linked: PostgreSQL loads libraries with their
//! symbols global, so it is there exactly when Citus is loaded in this process (it can
//! only be preloaded), and etc_batch runs the same without Citus.

use std::sync::OnceLock;

/// Citus's `void Use2PCForCoordinatedTransaction(void)`, when Citus is loaded.
fn use_two_phases() -> Option<extern "C" fn()> {
    static FOUND: OnceLock<usize> = OnceLock::new();
    let address = *FOUND.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name, on the process's global symbols
        unsafe {
            libc::dlsym(
                libc::RTLD_DEFAULT,
                c"Use2PCForCoordinatedTransaction".as_ptr(),
            ) as usize
        }
    });
    // SAFETY: a function of that name and signature, exported by citus.so since Citus 9
    (address != 0).then(|| unsafe { std::mem::transmute::<usize, extern "C" fn()>(address) })
}

/// Has the transaction about to commit commit its work on Citus's workers in two
/// phases, if it did any.
pub fn in_two_phases() {
    if let Some(use_two_phases) = use_two_phases() {
        use_two_phases();
    }
}
