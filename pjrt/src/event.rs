//! `PJRT_Event`: work that completes once, with an error or none. An event is ready
//! when its work is done: the callbacks registered before then run when it completes,
//! those registered after run at once.

use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex};

use crate::error::{Error, call, into_raw, object};
use crate::ffi::{Head, Of, OfValue};

pub(crate) type OnReadyCallback = Option<unsafe extern "C" fn(error: *mut Error, user_arg: *mut c_void)>;

/// `PJRT_Event_OnReady_Args`.
#[repr(C)]
pub(crate) struct EventOnReadyArgs {
    pub(crate) head: Head,
    pub(crate) event: *mut Event,
    pub(crate) callback: OnReadyCallback,
    pub(crate) user_arg: *mut c_void,
}

/// A callback registered with `PJRT_Event_OnReady` and its argument.
struct Callback {
    function: unsafe extern "C" fn(*mut Error, *mut c_void),
    user_arg: usize,
}

#[derive(Default)]
struct State {
    /// `Some` once complete: the work's error, if it failed.
    outcome: Option<Option<Error>>,
    callbacks: Vec<Callback>,
}

/// The completion of one piece of work, shared by the work and every handle on it.
#[derive(Default)]
pub(crate) struct Completion {
    state: Mutex<State>,
    done: Condvar,
}

impl Completion {
    pub(crate) fn new() -> Arc<Completion> {
        Arc::new(Completion::default())
    }

    /// Completes the work (once; later calls are ignored) and runs the callbacks.
    pub(crate) fn complete(&self, outcome: Option<Error>) {
        let callbacks = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());

            if state.outcome.is_some() {
                return;
            }
            state.outcome = Some(outcome.clone());
            std::mem::take(&mut state.callbacks)
        };
        self.done.notify_all();
        for callback in callbacks {
            run(&callback, outcome.clone());
        }
    }

    fn is_ready(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).outcome.is_some()
    }

    /// Waits for the work and returns its error, if any.
    pub(crate) fn wait(&self) -> Option<Error> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(outcome) = &state.outcome {
                return outcome.clone();
            }
            state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn on_ready(&self, callback: Callback) {
        let outcome = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            match &state.outcome {
                Some(outcome) => outcome.clone(),
                None => return state.callbacks.push(callback),
            }
        };
        run(&callback, outcome);
    }
}

fn run(callback: &Callback, outcome: Option<Error>) {
    let error = outcome.map_or(std::ptr::null_mut(), into_raw);
    // SAFETY: the caller's callback, with the argument it registered; it owns `error`.
    unsafe { (callback.function)(error, callback.user_arg as *mut c_void) };
}

/// What a `PJRT_Event*` points to.
pub(crate) struct Event(pub Arc<Completion>);

impl Event {
    /// A handle to give the caller.
    pub(crate) fn handle(completion: &Arc<Completion>) -> *mut Event {
        Box::into_raw(Box::new(Event(Arc::clone(completion))))
    }

    /// A handle on work that is already done.
    pub(crate) fn done(outcome: Option<Error>) -> *mut Event {
        let completion = Completion::new();
        completion.complete(outcome);
        Event::handle(&completion)
    }
}

pub(crate) unsafe extern "C" fn destroy(args: *mut Of<Event>) -> *mut Error {
    call("PJRT_Event_Destroy", args, |args| {
        if !args.object.is_null() {
            // SAFETY: an event this plugin handed out, destroyed once by its owner.
            drop(unsafe { Box::from_raw(args.object) });
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn is_ready(args: *mut OfValue<Event, bool>) -> *mut Error {
    call("PJRT_Event_IsReady", args, |args| {
        // SAFETY: an event this plugin handed out.
        args.value = unsafe { object("event", args.object) }?.0.is_ready();
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn error(args: *mut Of<Event>) -> *mut Error {
    let mut outcome = None;
    let failed = call("PJRT_Event_Error", args, |args| {
        // SAFETY: an event this plugin handed out.
        let event = unsafe { object("event", args.object) }?;
        if !event.0.is_ready() {
            return Err(Error::new(crate::error::Code::FailedPrecondition, "the event is not ready yet"));
        }
        outcome = event.0.wait();
        Ok(())
    });
    if failed.is_null() { outcome.map_or(std::ptr::null_mut(), into_raw) } else { failed }
}

pub(crate) unsafe extern "C" fn wait(args: *mut Of<Event>) -> *mut Error {
    let mut outcome = None;
    let failed = call("PJRT_Event_Await", args, |args| {
        // SAFETY: an event this plugin handed out.
        outcome = unsafe { object("event", args.object) }?.0.wait();
        Ok(())
    });
    if failed.is_null() { outcome.map_or(std::ptr::null_mut(), into_raw) } else { failed }
}

pub(crate) unsafe extern "C" fn on_ready(args: *mut EventOnReadyArgs) -> *mut Error {
    call("PJRT_Event_OnReady", args, |args| {
        // SAFETY: an event this plugin handed out.
        let event = unsafe { object("event", args.event) }?;
        let function = args.callback.ok_or_else(|| Error::invalid("the callback is NULL"))?;
        event.0.on_ready(Callback { function, user_arg: args.user_arg as usize });
        Ok(())
    })
}
