//! The auth listener's OpenAPI document: the auth service (spec 4.1), `POST /balance` and the
//! admin API. Every credential here travels in the JSON body (spec 5.5): `serviceToken`, or
//! `adminKey` on `/admin/...`.

use utoipa::OpenApi;

use crate::services::admin;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hearth authentication service",
        description = "Service tokens for the other Hearth services (spec section 4.1), the \
            signed-in user's balance, and the admin API that `hearth users`, `hearth balance` and \
            `hearth models` \
            use. Credentials travel in JSON body fields, never in headers: `serviceToken`, and \
            `adminKey` (`<data_dir>/admin.key`) on the admin routes. Any route that reads a \
            body may also answer 408 (the body came too slowly) or 413 (too large) with the \
            same error body."
    ),
    paths(
        super::health,
        super::token,
        super::validate,
        super::logout,
        super::balance,
        super::ui,
        admin::users,
        admin::balance,
        admin::credit,
        admin::models::list,
        admin::models::load,
        admin::models::unload,
        admin::models::pull,
        admin::models::reload,
    ),
    tags(
        (name = "auth", description = "Service tokens (spec 4.1) and the user's balance."),
        (name = "admin", description = "The admin API: `adminKey` in the body."),
        (name = "health", description = "Health (spec 2.1, 3.3)."),
        (name = "pages", description = "Web pages."),
    )
)]
struct AuthApi;

/// The auth listener's document, before [`crate::openapi::finish`].
pub fn document() -> utoipa::openapi::OpenApi {
    AuthApi::openapi()
}
