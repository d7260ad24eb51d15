//! The scheduler and the controllers: informers over the API, work queues, and pure planners
//! from observed objects to actions.

pub mod quantity;
pub mod endpointslice;
pub mod nodelifecycle;
pub mod pvbinder;
