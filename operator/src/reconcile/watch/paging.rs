//! How many objects a list page of the operator's watches holds.

/// Objects per page of a list. A page is held whole while it is read, and
/// one object may be as large as the API server allows (1.5 MB in etcd),
/// so a page costs at most about 75 MB however its objects were padded;
/// kube's default of 500 would be 750 MB.
pub const LIST_PAGE: u32 = 50;
