// @switchboard/client: the typed client for Switchboard's HTTP and WebSocket API.
export { SwitchboardClient } from "./client.js";
export type {
  BackoffOptions, ClientEvents, ClientOptions, ConnectedInfo, RetryInfo, RoomChange, RoomState, State, StateChange,
  StorageLike, ToolCallInfo, ToolFn, ToolResultInfo, UrlResolver, WebSocketCtor, WebSocketLike,
} from "./client.js";
export type { SwitchboardRoom, AppEvent, EventMap, RoomPresence } from "./room.js";
export type { PresenceList, PresenceJoinFn, PresenceLeaveFn, PresenceSyncFn } from "./presence.js";
export { HttpError } from "./http.js";
export {
  AuthError, ForbiddenError, GoneError, RateLimitedError, ServerGoingAwayError, SwitchboardError,
} from "./errors.js";
export type { SwitchboardErrorOptions } from "./errors.js";
export { StreamError, SwitchboardStream } from "./stream.js";
export type { StreamChunk, StreamInfo, StreamOptions, StreamResult } from "./stream.js";
export type { FetchLike, LoginResponse } from "./http.js";
export type * from "./frames.js";
export { SERVER_MESSAGES, CLIENT_MESSAGES } from "./frames.js";
export type { paths, components, operations } from "./rest.js";
export type { Answer, ApiArgs, Method, Operation, PathsWith, RequestBody } from "./api.js";
