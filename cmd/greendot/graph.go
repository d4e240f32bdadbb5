package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/pkg/presence"
)

// graphTimeout bounds one graph command's work against NATS.
const graphTimeout = 30 * time.Second

func graphCommand() *cli.Command {
	flags := func(extra ...cli.Flag) []cli.Flag { return concat(extra, natsFlags(), logFlags()) }
	return &cli.Command{
		Name:  "graph",
		Usage: "read and write the social graph and privacy settings that gateways authorize with",
		Description: "The graph lives in the " + presence.GraphBucket + " bucket: key follows.<a>.<b> says a follows b, key\n" +
			"settings.<user> holds the user's privacy settings ({\"last_seen\": \"contacts\"}). Apps may write the\n" +
			"same keys themselves. Existing buckets are used as they are; missing ones are created with --replicas.",
		Subcommands: []*cli.Command{
			{
				Name:         "follow",
				Usage:        "record that <follower> follows <followee>",
				ArgsUsage:    "<follower> <followee>",
				Flags:        flags(),
				OnUsageError: usageError,
				Action:       graphFollow,
			},
			{
				Name:         "unfollow",
				Usage:        "record that <follower> no longer follows <followee>",
				ArgsUsage:    "<follower> <followee>",
				Flags:        flags(),
				OnUsageError: usageError,
				Action:       graphUnfollow,
			},
			{
				Name:         "privacy",
				Usage:        "set who may see <user>'s last_seen: everyone, contacts (the users <user> follows) or nobody",
				ArgsUsage:    "<user> everyone|contacts|nobody",
				Flags:        flags(),
				OnUsageError: usageError,
				Action:       graphPrivacy,
			},
			{
				Name:         "show",
				Usage:        "print whom <user> follows, who follows <user>, their mutual followers and privacy setting",
				ArgsUsage:    "<user>",
				Flags:        flags(ownEnv("graph", boolFlag(catOutput, "json", "print one JSON object instead of text"))...),
				OnUsageError: usageError,
				Action:       graphShow,
			},
		},
		OnUsageError: usageError,
		Action: func(c *cli.Context) error {
			if c.Args().First() == "help" {
				if name := c.Args().Get(1); name != "" {
					return cli.ShowCommandHelp(c, name)
				}
				return cli.ShowSubcommandHelp(c)
			}
			if c.Args().Present() {
				return fmt.Errorf("unknown graph command %s: want follow, unfollow, privacy or show", quote(c.Args().First()))
			}
			return cli.ShowSubcommandHelp(c)
		},
	}
}

// graphArgs checks a graph command's positional arguments: their number,
// and that the first n are user ids.
func graphArgs(c *cli.Context, want, userIDs int) ([]string, error) {
	args := c.Args().Slice()
	if len(args) != want {
		hint := ""
		if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "-") }) {
			hint = " (flags go before the arguments; -- ends the flags, for a user id that starts with -)"
		}
		return nil, fmt.Errorf("want %d arguments, got %d: usage: greendot graph %s [flags] %s%s", want, len(args), c.Command.Name, c.Command.ArgsUsage, hint)
	}
	for _, id := range args[:userIDs] {
		if !presence.ValidUserID(id) {
			return nil, fmt.Errorf("invalid user id %s: want 1 to %d characters of A-Z a-z 0-9 _ -", quote(id), presence.MaxUserIDLen)
		}
	}
	return args, nil
}

// withStore connects to NATS, binds greendot's buckets and calls fn.
func withStore(c *cli.Context, fn func(ctx context.Context, store *presence.Store) error) error {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	buckets, err := bucketOptions(c)
	if err != nil {
		return err
	}
	nc, err := natsconn.Connect(natsOptions(c, "greendot graph", log))
	if err != nil {
		return err
	}
	defer closeNATS(nc)
	ctx, cancel := context.WithTimeout(c.Context, graphTimeout)
	defer cancel()
	store, err := presence.Bind(ctx, nc, buckets)
	if err != nil {
		return err
	}
	return fn(ctx, store)
}

func graphFollow(c *cli.Context) error {
	args, err := graphArgs(c, 2, 2)
	if err != nil {
		return err
	}
	a, b := args[0], args[1]
	if a == b {
		return fmt.Errorf("%s cannot follow themselves: a user may always watch their own presence", a)
	}
	return withStore(c, func(ctx context.Context, store *presence.Store) error {
		already, err := store.Follows(ctx, a, b)
		if err != nil {
			return err
		}
		if already {
			fmt.Fprintf(c.App.Writer, "%s already follows %s\n", a, b)
			return nil
		}
		if err := store.Follow(ctx, a, b); err != nil {
			return fmt.Errorf("follow %s -> %s: %w", a, b, err)
		}
		back, err := store.Follows(ctx, b, a)
		if err != nil {
			return err
		}
		if back {
			fmt.Fprintf(c.App.Writer, "%s now follows %s; %s follows %s too, so they are mutual followers\n", a, b, b, a)
		} else {
			fmt.Fprintf(c.App.Writer, "%s now follows %s\n", a, b)
		}
		return nil
	})
}

func graphUnfollow(c *cli.Context) error {
	args, err := graphArgs(c, 2, 2)
	if err != nil {
		return err
	}
	a, b := args[0], args[1]
	return withStore(c, func(ctx context.Context, store *presence.Store) error {
		follows, err := store.Follows(ctx, a, b)
		if err != nil {
			return err
		}
		if !follows {
			fmt.Fprintf(c.App.Writer, "%s does not follow %s\n", a, b)
			return nil
		}
		if err := store.Unfollow(ctx, a, b); err != nil {
			return fmt.Errorf("unfollow %s -> %s: %w", a, b, err)
		}
		fmt.Fprintf(c.App.Writer, "%s no longer follows %s\n", a, b)
		return nil
	})
}

func graphPrivacy(c *cli.Context) error {
	args, err := graphArgs(c, 2, 1)
	if err != nil {
		return err
	}
	user := args[0]
	vis, err := presence.ParseVisibility(args[1])
	if err != nil {
		return fmt.Errorf("privacy %s: want everyone, contacts or nobody", quote(args[1]))
	}
	return withStore(c, func(ctx context.Context, store *presence.Store) error {
		// last_seen is all the settings hold: writing them whole, unread,
		// also repairs a value written by hand that cannot be read.
		if err := store.SetSettings(ctx, user, presence.Settings{LastSeen: vis}); err != nil {
			return fmt.Errorf("privacy of %s: %w", user, err)
		}
		fmt.Fprintf(c.App.Writer, "%s's last_seen is now %s\n", user, describeVisibility(user, vis))
		return nil
	})
}

// describeVisibility says in words who may see a user's last_seen.
func describeVisibility(user string, v presence.Visibility) string {
	switch v {
	case presence.Everyone:
		return "visible to everyone allowed to watch " + user
	case presence.Nobody:
		return "hidden from everyone"
	default:
		return "visible to the users " + user + " follows (contacts)"
	}
}

// graphView is what graph show prints.
type graphView struct {
	UserID    string   `json:"user_id"`
	Following []string `json:"following"`
	Followers []string `json:"followers"`
	Mutuals   []string `json:"mutuals"`
	// LastSeen is the effective last_seen visibility; LastSeenDefault is
	// true when the user has not chosen one.
	LastSeen        presence.Visibility `json:"last_seen"`
	LastSeenDefault bool                `json:"last_seen_default"`
}

func graphShow(c *cli.Context) error {
	args, err := graphArgs(c, 1, 1)
	if err != nil {
		return err
	}
	user := args[0]
	return withStore(c, func(ctx context.Context, store *presence.Store) error {
		following, err := store.Following(ctx, user)
		if err != nil {
			return err
		}
		followers, err := store.Followers(ctx, user)
		if err != nil {
			return err
		}
		st, err := store.Settings(ctx, user)
		if err != nil {
			return err
		}
		v := graphView{
			UserID:          user,
			Following:       sorted(following),
			Followers:       sorted(followers),
			Mutuals:         []string{},
			LastSeen:        st.LastSeenVisibility(),
			LastSeenDefault: st.LastSeen == "",
		}
		for _, u := range v.Following {
			if _, ok := slices.BinarySearch(v.Followers, u); ok {
				v.Mutuals = append(v.Mutuals, u)
			}
		}
		if c.Bool("json") {
			enc := json.NewEncoder(c.App.Writer)
			enc.SetIndent("", "  ")
			return enc.Encode(&v)
		}
		return printGraph(c.App.Writer, &v)
	})
}

func sorted(s []string) []string {
	if s == nil {
		return []string{}
	}
	slices.Sort(s)
	return slices.Compact(s)
}

func printGraph(w io.Writer, v *graphView) error {
	list := func(s []string) string {
		if len(s) == 0 {
			return "(none)"
		}
		return fmt.Sprintf("%s (%d)", strings.Join(s, ", "), len(s))
	}
	privacy := string(v.LastSeen)
	if v.LastSeenDefault {
		privacy += " (default)"
	}
	_, err := fmt.Fprintf(w, "user:      %s\nfollowing: %s\nfollowers: %s\nmutuals:   %s\nlast_seen: %s: %s\n",
		v.UserID, list(v.Following), list(v.Followers), list(v.Mutuals), privacy, describeVisibility(v.UserID, v.LastSeen))
	return err
}
