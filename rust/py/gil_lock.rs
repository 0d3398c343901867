//! `GilLock`: the worker pool's reader-writer lock, which on an interpreter with a GIL is the GIL.
//!
//! Every pool operation runs with the thread attached to the interpreter, and none runs Python code
//! while it holds the pool's lock (the first of the two safety rules). On an interpreter with a
//! GIL, attached means holding the GIL, and only Python code (or an explicit release, which the
//! pool never makes) hands the GIL to another thread: the GIL alone therefore already serialises
//! every critical section, and an atomic lock around them costs an uncontended `lock cmpxchg` on
//! entry and on exit for nothing (`benches/RESULTS.md`, "Issue 12 goals, session of 2026-12-03
//! 10:05", has the profile). There the lock is a borrow count checked like `RefCell`'s, which turns
//! a breach of the rule (a critical section entered again while one is open) into a panic, raised
//! to Python, rather than a data race. A free-threaded build, where threads run Python code at the
//! same time, keeps `parking_lot::RwLock`.

pub use imp::GilLock;

#[cfg(not(Py_GIL_DISABLED))]
mod imp {
    use std::cell::{Cell, UnsafeCell};
    use std::marker::PhantomData;
    use std::ops::{Deref, DerefMut};

    use pyo3::Python;

    /// Free, read by this many guards, or written (`WRITING`).
    const WRITING: isize = -1;

    pub struct GilLock<T> {
        state: Cell<isize>,
        value: UnsafeCell<T>,
    }

    // SAFETY: `read` and `write` take a `Python` token, so they run on a thread holding the
    // GIL; `try_read` is called only from the garbage collector's traversal, which runs under
    // the GIL too. No guard lives across anything that can release the GIL (no Python code
    // runs under it; see the module). So every access to `state` and `value` happens under
    // the GIL, which orders them between threads, and `T` moves between threads with it.
    unsafe impl<T: Send> Sync for GilLock<T> {}

    impl<T> GilLock<T> {
        pub fn new(value: T) -> Self {
            Self {
                state: Cell::new(0),
                value: UnsafeCell::new(value),
            }
        }

        pub fn read(&self, _py: Python<'_>) -> ReadGuard<'_, T> {
            self.try_read().unwrap_or_else(|| reentered())
        }

        /// A read guard unless a write is under way (a traversal by the garbage collector,
        /// which runs under the GIL and may start inside a write).
        pub fn try_read(&self) -> Option<ReadGuard<'_, T>> {
            let readers = self.state.get();
            if readers == WRITING {
                return None;
            }
            self.state.set(readers + 1);
            Some(ReadGuard {
                lock: self,
                not_send: PhantomData,
            })
        }

        pub fn write(&self, _py: Python<'_>) -> WriteGuard<'_, T> {
            if self.state.get() != 0 {
                reentered();
            }
            self.state.set(WRITING);
            WriteGuard {
                lock: self,
                not_send: PhantomData,
            }
        }
    }

    #[cold]
    fn reentered() -> ! {
        panic!("the worker pool was entered again from inside one of its own critical sections")
    }

    /// Guards stay on the thread that holds the GIL (`*const ()` is neither `Send` nor `Sync`).
    pub struct ReadGuard<'a, T> {
        lock: &'a GilLock<T>,
        not_send: PhantomData<*const ()>,
    }

    pub struct WriteGuard<'a, T> {
        lock: &'a GilLock<T>,
        not_send: PhantomData<*const ()>,
    }

    impl<T> Deref for ReadGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            // SAFETY: while a read guard lives, the state is a positive count and no write
            // guard can be made, so only shared references to the value exist.
            unsafe { &*self.lock.value.get() }
        }
    }

    impl<T> Drop for ReadGuard<'_, T> {
        fn drop(&mut self) {
            self.lock.state.set(self.lock.state.get() - 1);
        }
    }

    impl<T> Deref for WriteGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            // SAFETY: the write guard is the only guard while it lives.
            unsafe { &*self.lock.value.get() }
        }
    }

    impl<T> DerefMut for WriteGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: the write guard is the only guard while it lives, and `&mut self` makes
            // this the only reference made through it.
            unsafe { &mut *self.lock.value.get() }
        }
    }

    impl<T> Drop for WriteGuard<'_, T> {
        fn drop(&mut self) {
            self.lock.state.set(0);
        }
    }
}

#[cfg(Py_GIL_DISABLED)]
mod imp {
    use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
    use pyo3::Python;

    pub struct GilLock<T>(RwLock<T>);

    impl<T> GilLock<T> {
        pub fn new(value: T) -> Self {
            Self(RwLock::new(value))
        }

        pub fn read(&self, _py: Python<'_>) -> RwLockReadGuard<'_, T> {
            self.0.read()
        }

        pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
            self.0.try_read()
        }

        pub fn write(&self, _py: Python<'_>) -> RwLockWriteGuard<'_, T> {
            self.0.write()
        }
    }
}
