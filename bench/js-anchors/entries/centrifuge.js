// A chat client on Centrifugo (JSON protocol): the client, its subscriptions, join/leave and presence.
export { Centrifuge } from "centrifuge";
