// A chat client on Phoenix Channels: the socket (channels, reconnect, LongPoll fallback) and Presence.
export { Socket, Presence } from "phoenix";
