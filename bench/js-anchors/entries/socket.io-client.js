// A chat client on socket.io: io() (engine.io with its polling fallback, rooms are server-side).
export { io } from "socket.io-client";
