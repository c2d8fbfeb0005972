pub mod spdy {
    #[path = "/work/main/src/spdy/codec/mod.rs"]
    pub mod codec;
    #[path = "/work/main/src/spdy/frame/mod.rs"]
    pub mod frame;
    #[path = "/work/main/src/spdy/header_block/mod.rs"]
    pub mod header_block;
}
